package cri

import (
	"context"
	"log/slog"
	"slices"
	"sync"

	"github.com/opencontainers/runtime-spec/specs-go/features"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/crisp-runtime/crisp/controller"
	"github.com/crisp-runtime/crisp/internal/config"
)

// nodeFeatures are what the node offers pods whatever their handler: the kernel's
// mount_setattr (rro) and idmapped mounts where the snapshots live (userns).
type nodeFeatures struct{ rro, userns bool }

// probeHandlers decides each handler's CRI features, once at start: what the node
// offers, less what the handler's shim says it cannot run. A sandbox-mode shim is
// asked with -info, as containerd 2.x asks (shim-wasm, whose modules join no
// namespace, lists no "user"); one that prints no features document, or cannot be
// asked, gets the node's (a missing shim fails its pods anyway, and `criserver check`
// says so). A task-only shim's runc may be too old for recursive read-only mounts
// (runc < 1.2), and crisp sets up user namespaces only in its own shims: neither is
// offered there.
func probeHandlers(ctx context.Context, cfg config.Config, node nodeFeatures, log *slog.Logger) map[string]*runtime.RuntimeHandlerFeatures {
	out := make(map[string]*runtime.RuntimeHandlerFeatures, len(cfg.Runtimes))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, name := range cfg.HandlerNames() {
		rt := cfg.Runtimes[name]
		if rt.Mode() == config.SandboxModeTask {
			out[name] = &runtime.RuntimeHandlerFeatures{}
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			feat, err := controller.ShimFeatures(ctx, rt.Shim)
			f := handlerFeatures(node, feat)
			switch {
			case err != nil:
				log.Warn("cannot ask the handler's shim for its features: offering the node's", "handler", name, "err", err)
			case feat != nil && (f.RecursiveReadOnlyMounts != node.rro || f.UserNamespaces != node.userns):
				log.Info("the handler's shim offers less than the node", "handler", name,
					"recursive_read_only_mounts", f.RecursiveReadOnlyMounts, "user_namespaces", f.UserNamespaces)
			}
			mu.Lock()
			out[name] = f
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out
}

// handlerFeatures are the node's features less those the shim's OCI features document
// (nil: none printed) lacks: recursive read-only mounts need the "rro" mount option,
// user namespaces the "user" namespace (and ID-mapped mounts, when it says).
func handlerFeatures(node nodeFeatures, feat *features.Features) *runtime.RuntimeHandlerFeatures {
	f := &runtime.RuntimeHandlerFeatures{RecursiveReadOnlyMounts: node.rro, UserNamespaces: node.userns}
	if feat == nil {
		return f
	}
	f.RecursiveReadOnlyMounts = f.RecursiveReadOnlyMounts && slices.Contains(feat.MountOptions, "rro")
	linux := feat.Linux
	idmap := linux != nil && (linux.MountExtensions == nil || linux.MountExtensions.IDMap == nil ||
		linux.MountExtensions.IDMap.Enabled == nil || *linux.MountExtensions.IDMap.Enabled)
	f.UserNamespaces = f.UserNamespaces && idmap && slices.Contains(linux.Namespaces, "user")
	return f
}
