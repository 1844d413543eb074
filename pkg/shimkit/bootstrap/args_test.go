package bootstrap

import (
	"errors"
	"io"
	"testing"
)

func TestParseArgs(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		want    Args
		wantErr bool
	}{
		{args: []string{"-namespace", "k8s.io", "-id", "p1", "-address", "/a", "start"},
			want: Args{Flags: Flags{Namespace: "k8s.io", ID: "p1", Address: "/a"}, Action: "start"}},
		{args: []string{"-id", "p1", "-bundle", "/b", "-debug", "delete"},
			want: Args{Flags: Flags{ID: "p1", Bundle: "/b", Debug: true}, Action: "delete"}},
		{args: []string{"-namespace", "k8s.io", "-id", "p1"}, want: Args{Flags: Flags{Namespace: "k8s.io", ID: "p1"}}},
		{args: []string{"-info"}, want: Args{Info: true}},
		{args: []string{"--version"}, want: Args{Version: true}},
		{args: []string{"-v"}, want: Args{Version: true}},
		{args: []string{"-publish-binary", "/usr/bin/containerd", "-id", "p1", "start"},
			want: Args{Flags: Flags{PublishBinary: "/usr/bin/containerd", ID: "p1"}, Action: "start"}},
		{args: []string{"-id", "p1", "run"}, wantErr: true},
		{args: []string{"-nosuchflag"}, wantErr: true},
	} {
		if _, err := ParseArgs("shim-test", []string{"-nosuchflag"}, io.Discard); !errors.Is(err, ErrUsage) {
			t.Fatalf("a bad flag = %v, want ErrUsage", err)
		}
		got, err := ParseArgs("shim-test", tc.args, io.Discard)
		if (err != nil) != tc.wantErr || (err == nil && got != tc.want) {
			t.Errorf("ParseArgs(%q) = %+v, %v; want %+v, error %v", tc.args, got, err, tc.want, tc.wantErr)
		}
	}
}
