package spec

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/opencontainers/runtime-spec/specs-go"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
)

// maxCDISpecErrors bounds how many broken spec files an error message lists.
const maxCDISpecErrors = 3

// CDI resolves Container Device Interface devices from the CDI spec files of a set of
// directories and applies their edits (device nodes, mounts, env, hooks) to a spec.
// It is safe for concurrent use.
type CDI struct {
	cache *cdi.Cache
	dirs  []string
}

// NewCDI scans dirs (later directories take priority) for CDI spec files. The cache
// is refreshed on use, and only by a container that requests CDI devices: the
// library's auto-refresh would keep an inotify watcher and a goroutine for the life
// of criserver and would race a device plugin that writes a spec file just before
// kubelet creates the container that needs it. A nil *CDI (no dirs) is CDI turned
// off: requests for CDI devices are then refused.
func NewCDI(dirs []string) *CDI {
	if len(dirs) == 0 {
		return nil
	}
	// NewCache's error is documented to be always nil; spec file errors are reported
	// when a device is looked up.
	cache, _ := cdi.NewCache(cdi.WithSpecDirs(dirs...), cdi.WithAutoRefresh(false))
	return &CDI{cache: cache, dirs: slices.Clone(dirs)}
}

// cdiDevices lists the fully qualified CDI devices a container requests: the CRI's
// CDIDevices, then those of kubelet's device-plugin annotations (cdi.k8s.io/<key>:
// "vendor.com/class=name,..."), each once, as containerd's WithCDI collects them.
func cdiDevices(cfg *runtime.ContainerConfig) ([]string, error) {
	var devices []string
	seen := map[string]bool{}
	add := func(d string) {
		if !seen[d] {
			seen[d] = true
			devices = append(devices, d)
		}
	}
	for _, d := range cfg.GetCDIDevices() {
		name := d.GetName()
		if _, _, _, err := parser.ParseQualifiedName(name); err != nil {
			return nil, invalidf("CDI device %q: %v", name, err)
		}
		add(name)
	}
	_, annotated, err := cdi.ParseAnnotations(cfg.GetAnnotations())
	if err != nil {
		return nil, invalidf("%s annotations: %v", cdi.AnnotationPrefix, err)
	}
	// Annotations come from a map: sorted, the edits apply in the same order each time.
	slices.Sort(annotated)
	for _, d := range annotated {
		add(d)
	}
	return devices, nil
}

// injectCDI applies the edits of the container's CDI devices to s. An unknown device
// (no spec file defines it, or two spec files of the same priority do: ambiguous) or
// one whose edits cannot be applied is an InvalidArgument error naming it.
func (c *CDI) injectCDI(s *specs.Spec, cfg *runtime.ContainerConfig) error {
	devices, err := cdiDevices(cfg)
	if err != nil || len(devices) == 0 {
		return err
	}
	return c.InjectDevices(s, devices)
}

// InjectDevices applies the edits of the named (fully qualified) CDI devices to s, as
// a container that requested them gets them; NRI plugins name devices this way.
func (c *CDI) InjectDevices(s *specs.Spec, devices []string) error {
	if len(devices) == 0 {
		return nil
	}
	if c == nil {
		return failedPreconditionf("CDI device %q requested but CDI is off (cdi.spec_dirs is empty)", devices[0])
	}
	// Refresh's error only reports spec files that failed to load; devices of other
	// files still resolve, and an unresolved device's error lists the broken files.
	_ = c.cache.Refresh()
	unresolved, err := c.cache.InjectDevices(s, devices...)
	if len(unresolved) > 0 {
		return c.unresolvedError(unresolved[0])
	}
	if err != nil {
		return invalidf("CDI devices %s: %v", quoteAll(devices), err)
	}
	return nil
}

// unresolvedError explains why device did not resolve: two spec files of the same
// priority define it (the cache drops such a device), or none does — perhaps because
// the file meant to define it failed to load, so those files are listed.
func (c *CDI) unresolvedError(device string) error {
	vendor, class, name := parser.ParseDevice(device)
	var defining []string
	loaded := map[string]bool{}
	for _, v := range c.cache.ListVendors() {
		for _, sp := range c.cache.GetVendorSpecs(v) {
			loaded[sp.GetPath()] = true
			if v == vendor && sp.GetClass() == class && sp.GetDevice(name) != nil {
				defining = append(defining, sp.GetPath())
			}
		}
	}
	if len(defining) > 1 {
		slices.Sort(defining)
		return invalidf("CDI device %q is ambiguous: spec files %s of the same priority define it", device, strings.Join(defining, ", "))
	}
	return invalidf("unknown CDI device %q: no spec file in %s defines it%s", device, strings.Join(c.dirs, ", "), c.loadErrors(loaded))
}

// loadErrors describes the spec files the cache could not load (those not in loaded),
// as a suffix of an error message ("" when there are none).
func (c *CDI) loadErrors(loaded map[string]bool) string {
	var b strings.Builder
	n := 0
	errs := c.cache.GetErrors()
	for _, p := range slices.Sorted(maps.Keys(errs)) {
		if loaded[p] {
			continue
		}
		if n == maxCDISpecErrors {
			b.WriteString("; more spec files failed to load")
			break
		}
		n++
		fmt.Fprintf(&b, "; spec file %s failed to load: %v", p, errors.Join(errs[p]...))
	}
	return b.String()
}

func quoteAll(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = fmt.Sprintf("%q", n)
	}
	return strings.Join(q, ", ")
}
