package controller

import (
	"strings"
	"testing"

	bootstrap "github.com/containerd/containerd/api/runtime/bootstrap/v1"
	"google.golang.org/protobuf/proto"
)

func TestParseStartResult(t *testing.T) {
	pb, _ := proto.Marshal(&bootstrap.BootstrapResult{Version: 3, Address: "unix:///run/crisp/s/abc", Protocol: "ttrpc"})
	grpcPB, _ := proto.Marshal(&bootstrap.BootstrapResult{Version: 3, Address: "unix:///x", Protocol: "grpc"})
	future, _ := proto.Marshal(&bootstrap.BootstrapResult{Version: 4, Address: "unix:///x", Protocol: "ttrpc"})
	cases := []struct {
		name    string
		out     []byte
		want    string
		wantErr string
	}{
		{"protobuf", pb, "unix:///run/crisp/s/abc", ""},
		{"json", []byte(`{"version":3,"address":"unix:///a","protocol":"ttrpc"}`), "unix:///a", ""},
		{"bare", []byte("unix:///b\n"), "unix:///b", ""},
		{"empty", nil, "", "no address"},
		{"grpc protocol", grpcPB, "", "needs ttrpc"},
		{"future version", future, "", "newer"},
		{"garbage", []byte("\xff\xfe"), "", "neither"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseStartResult(tc.out)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}
