package mirrortest

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/nodecache/nodecache/internal/runtimetest"
)

// EnvVersityGW names the versitygw binary (.ci/build-tools.sh builds it).
const EnvVersityGW = "NODECACHE_VERSITYGW"

// S3 is a real S3-compatible server for tests: versitygw serving a local directory on loopback,
// single account, one bucket.
type S3 struct {
	// Endpoint is http://127.0.0.1:PORT; Bucket exists; AccessKey and SecretKey are the account's.
	Endpoint, Bucket, AccessKey, SecretKey string
	// Dir is the directory versitygw serves: object KEY of Bucket is the file Dir/Bucket/KEY.
	Dir string
}

// ObjectPath is the file holding key of the bucket.
func (s *S3) ObjectPath(key string) string {
	return filepath.Join(s.Dir, s.Bucket, filepath.FromSlash(key))
}

// NewS3 starts versitygw (EnvVersityGW; the test is skipped when it is missing, failed with
// CI=true) over a temporary directory, and stops it when the test ends. Its credentials go where
// the AWS SDK's default credential chain looks first, the environment (AWS_ACCESS_KEY_ID,
// AWS_SECRET_ACCESS_KEY), with the instance metadata lookup off so that nothing leaves the
// machine: t.Setenv, so the test may not be parallel.
func NewS3(t testing.TB) *S3 {
	t.Helper()
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	bin := runtimetest.Binary(t, EnvVersityGW)
	s := &S3{Bucket: "nodecache", AccessKey: "nodecache-test", SecretKey: "nodecache-test-secret", Dir: t.TempDir()}
	t.Setenv("AWS_ACCESS_KEY_ID", s.AccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", s.SecretKey)
	if err := os.Mkdir(filepath.Join(s.Dir, s.Bucket), 0o755); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, "--port", addr, "--access", s.AccessKey, "--secret", s.SecretKey, "posix", s.Dir)
	logFile, err := os.Create(filepath.Join(t.TempDir(), "versitygw.log"))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatalf("start versitygw: %v", err)
	}
	t.Cleanup(func() {
		cancel()
		_ = cmd.Wait()
		_ = logFile.Close()
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			_ = c.Close()
			break
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(logFile.Name())
			t.Fatalf("versitygw did not listen on %s within 20s: %v\n%s", addr, err, b)
		}
		time.Sleep(50 * time.Millisecond)
	}
	s.Endpoint = "http://" + addr
	return s
}
