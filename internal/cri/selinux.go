package cri

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"

	"log/slog"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/selinux/go-selinux"
	"github.com/opencontainers/selinux/go-selinux/label"
	"golang.org/x/sys/unix"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/crisp-runtime/crisp/internal/config"
	"github.com/crisp-runtime/crisp/internal/mount"
)

// selinuxLevelRE is the MLS/MCS level form containerd accepts in seLinuxOptions
// (checkSelinuxLevel): a sensitivity (range) and optional categories.
var selinuxLevelRE = regexp.MustCompile(`^s\d(-s\d)??(:c\d{1,4}(\.c\d{1,4})?(,c\d{1,4}(\.c\d{1,4})?)*)?$`)

// labelBackend is the SELinux library the label store drives: the real one is
// selinuxLib; tests give a recording one, since on a host without SELinux the library
// hands out no labels at all.
type labelBackend interface {
	// InitLabels is label.InitLabels: a process and a mount label from options, at a
	// new unique level (reserved) unless the options give one.
	InitLabels(options []string) (process, mount string, err error)
	// Reserve marks label's level in use; selinux.ErrMCSAlreadyExists if it is.
	Reserve(label string) error
	// Release frees label's level.
	Release(label string)
}

// selinuxLib is the opencontainers/selinux library itself.
type selinuxLib struct{}

func (selinuxLib) InitLabels(options []string) (string, string, error) {
	return label.InitLabels(options)
}
func (selinuxLib) Reserve(l string) error { return selinux.ReserveLabelV2(l) }
func (selinuxLib) Release(l string)       { selinux.ReleaseLabel(l) }

// selinuxLabels hands out pods' and containers' SELinux labels and counts who uses
// each level (as containerd's label store): a pod's level stays reserved while the pod
// or any container at that level exists, so no other pod gets it, and it is freed with
// the last user. With SELinux off every label is "" and nothing is counted.
type selinuxLabels struct {
	lib    labelBackend
	mu     sync.Mutex
	levels map[string]int
}

func newSELinuxLabels(lib labelBackend) *selinuxLabels {
	return &selinuxLabels{lib: lib, levels: map[string]int{}}
}

// level is the MLS/MCS level of a process label ("" for none).
func level(processLabel string) string {
	if processLabel == "" {
		return ""
	}
	c, err := selinux.NewContext(processLabel)
	if err != nil {
		return ""
	}
	return c["level"]
}

// hold counts one more user of processLabel's level, reserving it in the library
// for the first (it may be reserved already: InitLabels just did, or a sibling).
func (l *selinuxLabels) hold(processLabel string) error {
	lv := level(processLabel)
	if lv == "" {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.levels[lv] == 0 {
		if err := l.lib.Reserve(processLabel); err != nil && !errors.Is(err, selinux.ErrMCSAlreadyExists) {
			return fmt.Errorf("reserve SELinux level %s: %w", lv, err)
		}
	}
	l.levels[lv]++
	return nil
}

// release drops one user of processLabel's level; the last frees it.
func (l *selinuxLabels) release(processLabel string) {
	lv := level(processLabel)
	if lv == "" {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	n, ok := l.levels[lv]
	if !ok {
		return
	}
	if n <= 1 {
		delete(l.levels, lv)
		l.lib.Release(processLabel)
		return
	}
	l.levels[lv] = n - 1
}

// inUse reports how many pods and containers hold level lv.
func (l *selinuxLabels) inUse(lv string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.levels[lv]
}

// newLabels allocates labels from options and holds their level; undone by release.
func (l *selinuxLabels) newLabels(options []string) (process, mount string, err error) {
	process, mount, err = l.lib.InitLabels(options)
	if err != nil {
		return "", "", fmt.Errorf("%w: SELinux options %v: %w", errdefs.ErrInvalidArgument, options, err)
	}
	if err := l.hold(process); err != nil {
		l.lib.Release(process)
		return "", "", err
	}
	return process, mount, nil
}

// podLabels are a new pod's process and mount labels: the policy's container
// contexts at a new unique level, with what the pod's seLinuxOptions set instead
// (a level given is used as given, as containerd and kubelet expect).
func (l *selinuxLabels) podLabels(opts *runtime.SELinuxOption) (process, mount string, err error) {
	options, err := selinuxOptions(opts)
	if err != nil {
		return "", "", err
	}
	return l.newLabels(options)
}

// containerLabels are a container's labels in a pod labelled podProcess: the pod's
// user, role, type and level, each replaced by what the container's seLinuxOptions
// set (CRI-O's rule; kubelet already merged the pod's options into the container's
// when the container sets none). A container without a pod label (SELinux off when
// the pod started) gets what its own options give.
func (l *selinuxLabels) containerLabels(podProcess string, opts *runtime.SELinuxOption) (process, mount string, err error) {
	own, err := selinuxOptions(opts)
	if err != nil {
		return "", "", err
	}
	options, err := selinux.DupSecOpt(podProcess)
	if err != nil {
		return "", "", fmt.Errorf("pod SELinux label %q: %w", podProcess, err)
	}
	return l.newLabels(mergeOptions(options, own))
}

// mergeOptions is base with each key that over sets replaced (label options are
// "key:value").
func mergeOptions(base, over []string) []string {
	out := make([]string, 0, len(base)+len(over))
	set := map[string]bool{}
	for _, o := range over {
		k, _, _ := strings.Cut(o, ":")
		set[k] = true
	}
	for _, o := range base {
		if k, _, _ := strings.Cut(o, ":"); !set[k] {
			out = append(out, o)
		}
	}
	return append(out, over...)
}

// selinuxOptions turns CRI seLinuxOptions into the label package's options
// (containerd's toLabel); a level that is no MLS/MCS level is refused.
func selinuxOptions(o *runtime.SELinuxOption) ([]string, error) {
	if o == nil {
		return nil, nil
	}
	if lv := o.GetLevel(); lv != "" && !selinuxLevelRE.MatchString(lv) {
		return nil, invalid("seLinuxOptions.level %q is not an MLS/MCS level (like s0:c123,c456)", lv)
	}
	var out []string
	for _, kv := range []struct{ k, v string }{{"user", o.GetUser()}, {"role", o.GetRole()}, {"type", o.GetType()}, {"level", o.GetLevel()}} {
		if kv.v != "" {
			out = append(out, kv.k+":"+kv.v)
		}
	}
	return out, nil
}

// initSELinux sets the SELinux library up for enable_selinux, as containerd does at
// start: off, the library reports SELinux disabled and hands out no labels (pods'
// seLinuxOptions are then ignored with a warning); on, levels are drawn from
// selinux_category_range categories. Off on an SELinux host, it returns the context
// pods' /dev/shm still needs (shmLabel), read from the policy before the library is
// disabled.
func initSELinux(cfg config.Config, log *slog.Logger) (shmLabelOff string) {
	if !cfg.EnableSELinux {
		if selinux.GetEnabled() {
			shmLabelOff = privFileLabel()
		}
		selinux.SetDisabled()
		return shmLabelOff
	}
	if !selinux.GetEnabled() {
		log.Info("enable_selinux is set but the host has no SELinux: pods and containers get no labels")
		return ""
	}
	if err := selinux.SetCategoryRange(uint32(cfg.SELinuxCategoryRange)); err != nil {
		log.Warn("selinux_category_range not applied", "range", cfg.SELinuxCategoryRange, "err", err)
	}
	proc, file, err := label.InitLabels(nil)
	if err != nil || proc == "" {
		log.Warn("SELinux is enabled but its policy names no container process label (contexts/lxc_contexts): pods and containers get no labels; install the policy's container module", "err", err)
		selinux.ReleaseLabel(proc)
		return ""
	}
	selinux.ReleaseLabel(proc)
	log.Info("SELinux labelling enabled", "mode", selinuxMode(), "process", proc, "file", file)
	return ""
}

// privFileLabel is the policy's file label for privileged containers (its
// lxc_contexts file type at the level kept for them, as CRI-O labels their files), or
// "" when the policy names none.
func privFileLabel() string {
	l := selinux.PrivContainerMountLabel()
	if c, err := selinux.NewContext(l); err != nil || c["type"] == "" {
		return ""
	}
	return l
}

// selinuxMode names the host's current SELinux mode.
func selinuxMode() string {
	switch selinux.EnforceMode() {
	case selinux.Enforcing:
		return "enforcing"
	case selinux.Permissive:
		return "permissive"
	}
	return "disabled"
}

// withMountLabel is ms with the SELinux context= option of mountLabel on each mount
// that takes one (not binds, which keep their source's labels), as containerd's
// client adds it to a container's rootfs mounts; ms itself is not modified.
func withMountLabel(ms []mount.Mount, mountLabel string) []mount.Mount {
	if mountLabel == "" {
		return ms
	}
	out := make([]mount.Mount, len(ms))
	for i, m := range ms {
		out[i] = m
		if m.Type == "bind" || slices.Contains(m.Options, "bind") || slices.Contains(m.Options, "rbind") {
			continue
		}
		out[i].Options = append(slices.Clone(m.Options), label.FormatMountLabel("", mountLabel))
	}
	return out
}

// relabelMounts gives each host path of a volume kubelet asked to relabel
// (selinux_relabel) the container's file label, recursively, as containerd does;
// a filesystem without labels (ENOTSUP) is left as it is.
func relabelMounts(paths []string, mountLabel string) error {
	for _, p := range paths {
		if err := label.Relabel(p, mountLabel, false); err != nil && !errors.Is(err, unix.ENOTSUP) {
			return fmt.Errorf("relabel volume %s with %s: %w", p, mountLabel, err)
		}
	}
	return nil
}
