package activation

import "testing"

func TestFlagValue(t *testing.T) {
	t.Parallel()
	tests := []struct {
		args []string
		want string
		ok   bool
	}{
		{[]string{"containerd", "--address", "/a.sock"}, "/a.sock", true},
		{[]string{"containerd", "--address=/a.sock"}, "/a.sock", true},
		{[]string{"containerd", "-a", "/a.sock"}, "/a.sock", true},
		{[]string{"containerd", "-address", "/a.sock"}, "/a.sock", true},
		{[]string{"containerd", "--config", "/c", "-a=/b.sock"}, "/b.sock", true},
		{[]string{"containerd", "--", "--address", "/a.sock"}, "", false},
		{[]string{"containerd", "--addressx", "/a.sock"}, "", false},
		{[]string{"containerd"}, "", false},
	}
	for _, tt := range tests {
		got, ok := flagValue(tt.args, "address", "a")
		if got != tt.want || ok != tt.ok {
			t.Errorf("flagValue(%q) = %q, %v; want %q, %v", tt.args, got, ok, tt.want, tt.ok)
		}
	}
}
