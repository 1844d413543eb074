package remote

import (
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

func TestNormalize(t *testing.T) {
	const d = "sha256:8e6ab5b2ac1a3e0a4e0c4e1a1b6b0b2f0c7b0c8a0d7c2e8f5c1b3d2e4f6a8b0c"
	for _, tc := range []struct{ in, want string }{
		{"busybox", "docker.io/library/busybox:latest"},
		{"library/busybox", "docker.io/library/busybox:latest"},
		{"busybox:1.36", "docker.io/library/busybox:1.36"},
		{"docker.io/busybox@" + d, "docker.io/library/busybox@" + d},
		{"docker.io/library/busybox:1.36@" + d, "docker.io/library/busybox:1.36@" + d},
		{"index.docker.io/library/busybox", "docker.io/library/busybox:latest"},
		{"registry.k8s.io/pause:3.10", "registry.k8s.io/pause:3.10"},
		{"host:5000/a/b:tag@" + d, "host:5000/a/b:tag@" + d},
		{"localhost/a", "localhost/a:latest"},
		{"127.0.0.1:5000/team/app", "127.0.0.1:5000/team/app:latest"},
		{"user/app", "docker.io/user/app:latest"},
		{"[::1]:5000/app:v1", "[::1]:5000/app:v1"},
	} {
		got, err := Normalize(tc.in)
		if err != nil {
			t.Errorf("Normalize(%q): %v", tc.in, err)
			continue
		}
		if got.String() != tc.want {
			t.Errorf("Normalize(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}

	for _, tc := range []struct{ in, why string }{
		{"", "empty"},
		{"BusyBox", "must be lowercase"},
		{"docker.io/Library/busybox", "must be lowercase"},
		{"busybox:", "invalid reference format"},
		{"busybox@sha256:abc", "invalid reference format"},
		{"busybox@md5:d41d8cd98f00b204e9800998ecf8427e", "unsupported digest algorithm"},
		{"a b", "invalid reference format"},
		{"busybox:tag with space", "invalid reference format"},
		{"-leading/dash", "invalid reference format"},
		{"host:5000/a/../b", "invalid reference format"},
		{strings.Repeat("a", 300), "more than 255 characters"},
	} {
		_, err := Normalize(tc.in)
		if !errdefs.IsInvalidArgument(err) {
			t.Errorf("Normalize(%q) = %v, want InvalidArgument", tc.in, err)
			continue
		}
		msg := err.Error()
		if !strings.Contains(msg, tc.why) || !strings.Contains(msg, "docker.io/library/busybox:1.36") {
			t.Errorf("Normalize(%q) error %q: want the reason %q and an example of a valid reference", tc.in, msg, tc.why)
		}
	}
}
