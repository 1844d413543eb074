package podfiles

import (
	"fmt"
	"net"
	"strings"

	"github.com/containerd/errdefs"
)

// Limits on a pod's DNS config. Servers and searches are kubelet's own limits
// (k8s.io/kubernetes pkg/apis/core/validation: MaxDNSNameservers,
// MaxDNSSearchPaths, MaxDNSSearchListChars), which kubelet trims its merged config to
// before it calls the runtime, so they never refuse a pod kubelet runs; glibc and musl
// use no more than 3 name servers anyway. Kubelet sets no limit on options: 64 is far
// past the options any resolver knows, and an option of 255 characters past the
// longest of them.
const (
	MaxDNSServers     = 3
	MaxDNSSearches    = 32
	MaxDNSSearchChars = 2048 // the searches with one space between each
	MaxDNSOptions     = 64
	MaxDNSOptionChars = 255
)

// MaxHostname is the kernel's limit on a hostname (HOST_NAME_MAX).
const MaxHostname = 64

// invalid is an InvalidArgument error whose text is the message alone, so that both
// the CRI server and the shim can return it as it is.
func invalid(format string, args ...any) error {
	return errdefs.ErrInvalidArgument.WithMessage(fmt.Sprintf(format, args...))
}

// oneWord reports whether s is a word of a resolv.conf or hosts line: non-empty, with
// no space, tab, line break or other control character, which would end the word or
// the line (NUL ends the string where the resolver reads it).
func oneWord(s string) bool {
	if s == "" {
		return false
	}
	for i := range len(s) {
		if s[i] <= ' ' || s[i] == 0x7f {
			return false
		}
	}
	return true
}

// Validate checks a DNS config as the CRI sends it (the field names are the CRI's
// dns_config): every server an IP address, every search and option one word, and
// kubelet's limits. It is what both of crisp's sandboxers check before a pod is made,
// and what ResolvConf checks again before it writes a line.
func (d DNS) Validate() error {
	if n := len(d.Servers); n > MaxDNSServers {
		return invalid("dns_config.servers: %d servers, at most %d are allowed (kubelet's limit; resolvers use no more)", n, MaxDNSServers)
	}
	for i, s := range d.Servers {
		if net.ParseIP(s) == nil {
			return invalid("dns_config.servers[%d] %q is not an IP address", i, s)
		}
	}
	if n := len(d.Searches); n > MaxDNSSearches {
		return invalid("dns_config.searches: %d domains, at most %d are allowed (kubelet's limit)", n, MaxDNSSearches)
	}
	chars := 0
	for i, s := range d.Searches {
		if !oneWord(s) {
			return invalid("dns_config.searches[%d] %q must be one non-empty domain without spaces, tabs, line breaks or other control characters", i, s)
		}
		chars += len(s)
	}
	if chars += max(len(d.Searches)-1, 0); chars > MaxDNSSearchChars {
		return invalid("dns_config.searches: %d characters with the spaces between them, at most %d are allowed (kubelet's limit)", chars, MaxDNSSearchChars)
	}
	if n := len(d.Options); n > MaxDNSOptions {
		return invalid("dns_config.options: %d options, at most %d are allowed", n, MaxDNSOptions)
	}
	for i, o := range d.Options {
		if !oneWord(o) || len(o) > MaxDNSOptionChars {
			return invalid("dns_config.options[%d] %q must be one non-empty option of at most %d characters without spaces, tabs, line breaks or other control characters (like ndots:5)", i, o, MaxDNSOptionChars)
		}
	}
	return nil
}

// ValidateHostname checks a pod's hostname for the files it is written to
// (/etc/hostname, and /etc/hosts next to the pod's IP) and the kernel: 1 to
// MaxHostname characters, none of them a space, a tab, a line break, another control
// character or '/'.
func ValidateHostname(h string) error {
	if len(h) > MaxHostname || !oneWord(h) || strings.ContainsRune(h, '/') {
		return invalid("hostname %q must be 1-%d characters without spaces, tabs, line breaks, other control characters or '/'", h, MaxHostname)
	}
	return nil
}

// Validate checks everything of p that Write puts into a file: the hostname (none
// is written as an empty /etc/hostname), the IP and the DNS config.
func (p Pod) Validate() error {
	if p.Hostname != "" {
		if err := ValidateHostname(p.Hostname); err != nil {
			return err
		}
	}
	if p.IP != "" && net.ParseIP(p.IP) == nil {
		return invalid("pod IP %q is not an IP address", p.IP)
	}
	return p.DNS.Validate()
}
