// Package podfiles writes the files a pod's containers bind-mount as /etc/hostname,
// /etc/hosts and /etc/resolv.conf, and mounts the tmpfs they share as /dev/shm. Both
// of crisp's sandboxers need them: crisp's CRI server for its own pods, and crisp's
// shim for the pods containerd's shim sandboxer gives it (containerd writes them only
// for its podsandbox). Both check what goes into the files with its validator
// (Pod.Validate, DNS.Validate), which Write applies again. It is a leaf package so that
// neither side imports the other.
package podfiles

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/opencontainers/selinux/go-selinux/label"
	"golang.org/x/sys/unix"

	"github.com/crisp-runtime/crisp/internal/atomicfile"
	"github.com/crisp-runtime/crisp/internal/mount"
)

// Names of the files in a pod's directory, and of its /dev/shm mount point.
const (
	HostnameFile = "hostname"
	HostsFile    = "hosts"
	ResolvFile   = "resolv.conf"
	ShmDir       = "shm"
)

// ShmOptions are the tmpfs options of a pod's /dev/shm: the size containerd and
// docker give it.
const ShmOptions = "mode=1777,size=65536k"

// DNS is a pod's DNS config as kubelet sends it (CRI DNSConfig).
type DNS struct {
	Servers, Searches, Options []string
}

// Pod is what the files say.
type Pod struct {
	Hostname string
	// IP is the pod's address, written to /etc/hosts with the hostname; "" for none.
	IP string
	// HostNetwork pods get the host's /etc/hosts.
	HostNetwork bool
	DNS         DNS
}

// Write writes /etc/hostname, /etc/hosts and /etc/resolv.conf for a pod into dir. The
// host's own files are used where the pod shares the host's network and where kubelet
// gave no DNS config, as containerd and CRI-O do. A pod that fails Validate is refused
// (InvalidArgument) before anything is written: the files hold no line break Write did
// not put there itself.
func Write(dir string, p Pod) error {
	if err := p.Validate(); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create pod dir: %w", err)
	}
	if err := atomicfile.Write(filepath.Join(dir, HostnameFile), []byte(p.Hostname+"\n"), 0o644); err != nil {
		return err
	}
	var hosts []byte
	if p.HostNetwork {
		data, err := os.ReadFile("/etc/hosts")
		if err != nil && !os.IsNotExist(err) {
			return fmt.Errorf("read host /etc/hosts: %w", err)
		}
		hosts = data
	} else {
		var b bytes.Buffer
		b.WriteString("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\nfe00::0\tip6-localnet\nff00::0\tip6-mcastprefix\nff02::1\tip6-allnodes\nff02::2\tip6-allrouters\n")
		if p.IP != "" && p.Hostname != "" {
			fmt.Fprintf(&b, "%s\t%s\n", p.IP, p.Hostname)
		}
		hosts = b.Bytes()
	}
	if err := atomicfile.Write(filepath.Join(dir, HostsFile), hosts, 0o644); err != nil {
		return err
	}
	resolv, err := ResolvConf(p.DNS)
	if err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(dir, ResolvFile), resolv, 0o644)
}

// ResolvConf renders a pod's resolv.conf from its DNS config, or copies the host's when
// kubelet gave none. A config that fails DNS.Validate is refused (InvalidArgument).
func ResolvConf(dns DNS) ([]byte, error) {
	if err := dns.Validate(); err != nil {
		return nil, err
	}
	if len(dns.Servers) == 0 && len(dns.Searches) == 0 && len(dns.Options) == 0 {
		data, err := os.ReadFile("/etc/resolv.conf")
		if err != nil && !os.IsNotExist(err) {
			return nil, fmt.Errorf("read host /etc/resolv.conf: %w", err)
		}
		return data, nil
	}
	var b bytes.Buffer
	if len(dns.Searches) > 0 {
		fmt.Fprintf(&b, "search %s\n", strings.Join(dns.Searches, " "))
	}
	for _, s := range dns.Servers {
		fmt.Fprintf(&b, "nameserver %s\n", s)
	}
	if len(dns.Options) > 0 {
		fmt.Fprintf(&b, "options %s\n", strings.Join(dns.Options, " "))
	}
	return b.Bytes(), nil
}

// MountShm mounts a pod's /dev/shm tmpfs at path, creating the directory; a non-empty
// mountLabel is its SELinux context (context=), so the pod's containers may use it.
func MountShm(path, mountLabel string) error {
	if err := os.MkdirAll(path, 0o700); err != nil {
		return fmt.Errorf("create pod shm dir: %w", err)
	}
	if err := unix.Mount("shm", path, "tmpfs", unix.MS_NOEXEC|unix.MS_NOSUID|unix.MS_NODEV, label.FormatMountLabel(ShmOptions, mountLabel)); err != nil {
		return fmt.Errorf("mount pod /dev/shm at %s: %w", path, err)
	}
	return nil
}

// Remove unmounts dir's /dev/shm and removes dir; a dir that is gone is not an error.
func Remove(dir string) error {
	if err := mount.Unmount(filepath.Join(dir, ShmDir)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("unmount pod /dev/shm: %w", err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove pod files: %w", err)
	}
	return nil
}

// Paths are where a pod's files are, for its containers' bind mounts. Shm is "" when
// the pod has no /dev/shm of its own (it uses the host's IPC namespace).
type Paths struct {
	Hostname, Hosts, Resolv, Shm string
}

// In is Paths of the files Write put in dir, with the /dev/shm MountShm mounted at
// dir/ShmDir when shm is true.
func In(dir string, shm bool) Paths {
	p := Paths{
		Hostname: filepath.Join(dir, HostnameFile),
		Hosts:    filepath.Join(dir, HostsFile),
		Resolv:   filepath.Join(dir, ResolvFile),
	}
	if shm {
		p.Shm = filepath.Join(dir, ShmDir)
	}
	return p
}
