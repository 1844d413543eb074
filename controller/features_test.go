package controller

import (
	"strings"
	"testing"

	"github.com/containerd/containerd/api/types"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

func TestParseInfoFeatures(t *testing.T) {
	t.Parallel()
	info := func(f *anypb.Any) []byte {
		b, err := proto.Marshal(&types.RuntimeInfo{Name: "x", Features: f})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	doc := `{"ociVersionMin":"1.0.0","mountOptions":["ro","rro"],"linux":{"namespaces":["user"]}}`
	tests := []struct {
		name    string
		data    []byte
		wantNil bool
		wantErr string
	}{
		{name: "document", data: info(&anypb.Any{TypeUrl: featuresTypeURL, Value: []byte(doc)})},
		{name: "none", data: info(nil), wantNil: true},
		{name: "other type", data: info(&anypb.Any{TypeUrl: "example.com/Other", Value: []byte(doc)}), wantErr: "runtime features of type"},
		{name: "bad JSON", data: info(&anypb.Any{TypeUrl: featuresTypeURL, Value: []byte("{")}), wantErr: "decode runtime features"},
		{name: "not protobuf", data: []byte("shim-x version 1\n"), wantErr: "decode RuntimeInfo"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := parseInfoFeatures(tt.data)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if (f == nil) != tt.wantNil {
				t.Fatalf("features %v, want nil %v", f, tt.wantNil)
			}
			if f != nil && (f.OCIVersionMin != "1.0.0" || len(f.MountOptions) != 2 || f.Linux.Namespaces[0] != "user") {
				t.Errorf("features %+v", f)
			}
		})
	}
}
