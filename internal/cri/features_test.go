package cri

import (
	"testing"

	"github.com/opencontainers/runtime-spec/specs-go/features"
)

func TestHandlerFeatures(t *testing.T) {
	t.Parallel()
	yes, no := true, false
	full := nodeFeatures{rro: true, userns: true}
	runcLike := &features.Features{MountOptions: []string{"bind", "ro", "rro"}, Linux: &features.Linux{
		Namespaces:      []string{"cgroup", "ipc", "mount", "network", "pid", "user", "uts"},
		MountExtensions: &features.MountExtensions{IDMap: &features.IDMap{Enabled: &yes}},
	}}
	tests := []struct {
		name        string
		node        nodeFeatures
		feat        *features.Features
		rro, userns bool
	}{
		{name: "no document: the node's", node: full, rro: true, userns: true},
		{name: "no document, node without", node: nodeFeatures{}, rro: false, userns: false},
		// shim-runc's shape (runc features): every namespace, idmap on.
		{name: "runc-like", node: full, feat: runcLike, rro: true, userns: true},
		{name: "runc-like on a node without", node: nodeFeatures{rro: true}, feat: runcLike, rro: true, userns: false},
		// shim-wasm's shape: no namespace at all.
		{name: "wasm-like", node: full, feat: &features.Features{MountOptions: []string{"ro", "rro"}, Linux: &features.Linux{Namespaces: []string{}}}, rro: true, userns: false},
		{name: "no linux section", node: full, feat: &features.Features{MountOptions: []string{"rro"}}, rro: true, userns: false},
		{name: "no rro option", node: full, feat: &features.Features{MountOptions: []string{"ro"}, Linux: &features.Linux{Namespaces: []string{"user"}}}, rro: false, userns: true},
		{name: "idmap off", node: full, feat: &features.Features{Linux: &features.Linux{Namespaces: []string{"user"},
			MountExtensions: &features.MountExtensions{IDMap: &features.IDMap{Enabled: &no}}}}, rro: false, userns: false},
		{name: "idmap on", node: full, feat: &features.Features{Linux: &features.Linux{Namespaces: []string{"user"},
			MountExtensions: &features.MountExtensions{IDMap: &features.IDMap{Enabled: &yes}}}}, rro: false, userns: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := handlerFeatures(tt.node, tt.feat)
			if f.RecursiveReadOnlyMounts != tt.rro || f.UserNamespaces != tt.userns {
				t.Errorf("rro %v, userns %v; want %v, %v", f.RecursiveReadOnlyMounts, f.UserNamespaces, tt.rro, tt.userns)
			}
		})
	}
}
