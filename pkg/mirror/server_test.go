package mirror

import (
	"bytes"
	"strings"
	"testing"

	"github.com/rs/zerolog"
)

func TestDistributionLogLevels(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		line, level string
	}{
		{`level=error msg="response completed with error" err.code=unavailable`, "debug"},
		{`level=info msg="response completed"`, "debug"},
		{`level=error msg="unknown error serving blob"`, "error"},
		{`level=warning msg="something odd"`, "warn"},
	} {
		var buf bytes.Buffer
		w := zerologWriter{zerolog.New(&buf)}
		_, _ = w.Write([]byte(tc.line + "\n"))
		if !strings.Contains(buf.String(), `"level":"`+tc.level+`"`) {
			t.Errorf("%q logged as %s, want %s", tc.line, buf.String(), tc.level)
		}
	}
}
