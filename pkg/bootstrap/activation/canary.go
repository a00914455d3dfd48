package activation

import "context"

// canary is filled in by canary_pull.go.
func (e *evaluator) canary(ctx context.Context, rep *RuntimeReport) {}
