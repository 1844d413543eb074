package apparmor

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"

	ctrdapparmor "github.com/containerd/containerd/v2/contrib/apparmor"
	hostapparmor "github.com/containerd/containerd/v2/pkg/apparmor"
)

// DefaultProfile is the name crisp's default profile is loaded under (containerd's is
// cri-containerd.apparmor.d, CRI-O's crio-default).
const DefaultProfile = "crisp-default"

// profilesFile lists the loaded profiles, one "name (mode)" per line.
const profilesFile = "/sys/kernel/security/apparmor/profiles"

// Host is the host's AppArmor as crisp uses it. The zero value is unusable; New makes one.
type Host struct {
	profiles string
	// load loads crisp's default profile under the given name (containerd's
	// LoadDefaultProfile, which checks first whether it is loaded).
	load func(name string) error
	// mu serialises loads: two creates that find the profile gone load it once.
	mu sync.Mutex
}

// New returns the host's AppArmor when the host enforces it and disabled is false,
// else nil: nil means no container gets a profile, as containerd decides with
// disable_apparmor or on a host without AppArmor (no securityfs entry, module not
// enabled, no /sbin/apparmor_parser, or inside a container).
func New(disabled bool) *Host {
	if disabled || !hostapparmor.HostSupports() {
		return nil
	}
	return &Host{profiles: profilesFile, load: ctrdapparmor.LoadDefaultProfile}
}

// DefaultLoaded reports whether crisp's default profile is loaded now.
func (h *Host) DefaultLoaded() (bool, error) { return h.Loaded(DefaultProfile) }

// EnsureDefault loads crisp's default profile unless it is loaded, and returns its
// name. criserver calls it at start; every container that gets the default profile
// calls it again, because an operator's aa-teardown or apparmor reload may have
// removed it meanwhile, and runc would then fail the container at init.
func (h *Host) EnsureDefault() (string, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.load(DefaultProfile); err != nil {
		return "", fmt.Errorf("load AppArmor profile %s: %w", DefaultProfile, err)
	}
	return DefaultProfile, nil
}

// Loaded reports whether a profile of that name is loaded in the kernel.
func (h *Host) Loaded(name string) (bool, error) {
	f, err := os.Open(h.profiles)
	if err != nil {
		return false, fmt.Errorf("read loaded AppArmor profiles: %w", err)
	}
	defer f.Close()
	return hasProfile(f, name)
}

// dumpDefault is crisp's default profile as it would be loaded.
func dumpDefault() (string, error) { return ctrdapparmor.DumpDefaultProfile(DefaultProfile) }

// hasProfile scans a profiles listing for name. Names may contain spaces, so a line
// matches when it is the name followed by " (" and the mode.
func hasProfile(r io.Reader, name string) (bool, error) {
	s := bufio.NewScanner(r)
	s.Buffer(make([]byte, 0, 4096), 1<<20)
	for s.Scan() {
		line := s.Text()
		if rest, ok := strings.CutPrefix(line, name); ok && strings.HasPrefix(rest, " (") {
			return true, nil
		}
	}
	if err := s.Err(); err != nil && !errors.Is(err, io.EOF) {
		return false, fmt.Errorf("read loaded AppArmor profiles: %w", err)
	}
	return false, nil
}
