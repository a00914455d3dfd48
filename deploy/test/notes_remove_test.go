package test

import (
	"strings"
	"testing"
)

// TestChartSharedNotesRemove (issue 26): mode=shared's NOTES say what helm uninstall leaves for
// the storage chosen: filesystem removes the PVC (and the cache unless the StorageClass keeps
// the volume), s3 has no PVC and leaves the cache in the bucket and the Secret that is the
// user's (was "the PVC and the cache go with it" for both).
func TestChartSharedNotesRemove(t *testing.T) {
	t.Parallel()
	c := loadChart(t)
	for _, tc := range []struct {
		name, values string
		want, never  []string
	}{
		{"filesystem", "{mode: shared}",
			[]string{"helm uninstall nodecache-shared -n nodecache (the PVC goes with it, and the cache with it unless its StorageClass's reclaimPolicy is Retain)."},
			[]string{"bucket"}},
		{"s3", "{mode: shared, shared: {storage: {type: s3, s3: {bucket: images, rootDirectory: /nodecache, secretName: s3-creds}}}}",
			[]string{"helm uninstall nodecache-shared -n nodecache (no PVC: the cache stays in the S3 bucket images under /nodecache; delete those objects to free it, and the Secret s3-creds, which is yours, not the chart's)."},
			[]string{"PVC goes", "PVC and the cache"}},
		{"s3, bucket in the Secret", "{mode: shared, shared: {storage: {type: s3, s3: {secretName: s3-creds}}}}",
			[]string{"(no PVC: the cache stays in the S3 bucket; delete those objects to free it, and the Secret s3-creds, which is yours, not the chart's)."},
			[]string{"PVC goes", "PVC and the cache"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, notes, err := renderValues(c, "nodecache-shared", "nodecache", vals(t, tc.values), false)
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.want {
				if !strings.Contains(notes, w) {
					t.Errorf("NOTES do not say %q:\n%s", w, notes)
				}
			}
			for _, n := range tc.never {
				if strings.Contains(notes, n) {
					t.Errorf("NOTES say %q:\n%s", n, notes)
				}
			}
		})
	}
}
