package remote

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/containerd/containerd/v2/core/remotes/docker"
	hostsconfig "github.com/containerd/containerd/v2/core/remotes/docker/config"
	"github.com/containerd/errdefs"
	"github.com/pelletier/go-toml/v2"
)

// defaultHostDir is containerd's directory that applies to every registry without
// one of its own.
const defaultHostDir = "_default"

// hostsFile is the hosts.toml of a host directory, decoded only to check it:
// containerd's own parser (used for the endpoints) logs a file it cannot decode and
// falls back to the directory's certificate files, so a typo would silently send
// pulls to the upstream registry without the configured TLS. The field types are
// what containerd accepts; toml refuses others.
type hostsFile struct {
	hostsFileEntry
	Server string                    `toml:"server"`
	Host   map[string]hostsFileEntry `toml:"host"`
}

type hostsFileEntry struct {
	Capabilities []string       `toml:"capabilities"`
	CA           any            `toml:"ca"`
	Client       any            `toml:"client"`
	SkipVerify   *bool          `toml:"skip_verify"`
	Header       map[string]any `toml:"header"`
	OverridePath bool           `toml:"override_path"`
	DialTimeout  string         `toml:"dial_timeout"`
}

// findHostDir returns the host directory under root for host (a reference's
// registry, "docker.io", "myreg:5000"), or "" when none applies. The order is
// containerd's ("myreg_5000_", "myreg:5000", then "_default") with crisp's
// wildcard directories ("*.example.com", the longest suffix first) before
// "_default": a wildcard matches one or more labels, as in "*.example.com"
// matching "a.example.com" and "b.a.example.com" but not "example.com"; a port is
// part of the name on both sides.
func findHostDir(root, host string) (string, error) {
	var dirs []string
	if i := strings.LastIndex(host, ":"); i > 0 {
		dirs = append(dirs, host[:i]+"_"+host[i+1:]+"_")
	}
	dirs = append(dirs, host)
	for _, d := range dirs {
		if ok, err := isDir(filepath.Join(root, d)); ok || err != nil {
			return filepath.Join(root, d), err
		}
	}
	entries, err := os.ReadDir(root)
	if errors.Is(err, os.ErrNotExist) {
		// As in containerd: a config_path that does not exist (yet) configures nothing.
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read registry config_path %s: %w", root, err)
	}
	var wild []string
	for _, e := range entries {
		n := e.Name()
		if !strings.HasPrefix(n, "*.") || !e.IsDir() {
			continue
		}
		if strings.HasSuffix(host, n[1:]) && len(host) > len(n)-1 {
			wild = append(wild, n)
		}
	}
	if len(wild) > 0 {
		sort.Slice(wild, func(i, j int) bool { return len(wild[i]) > len(wild[j]) })
		return filepath.Join(root, wild[0]), nil
	}
	d := filepath.Join(root, defaultHostDir)
	if ok, err := isDir(d); ok || err != nil {
		return d, err
	}
	return "", nil
}

func isDir(p string) (bool, error) {
	fi, err := os.Stat(p)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return fi.IsDir(), nil
}

// checkHostsFile decodes dir's hosts.toml (if any) and checks what containerd would
// refuse or ignore, so that a bad file is an error naming it, not a silent fallback.
func checkHostsFile(dir string) error {
	path := filepath.Join(dir, "hosts.toml")
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var f hostsFile
	if err := toml.Unmarshal(b, &f); err != nil {
		var derr *toml.DecodeError
		if errors.As(err, &derr) {
			row, col := derr.Position()
			if k := derr.Key(); len(k) > 0 {
				return fmt.Errorf("%s:%d:%d: key %s: %w", path, row, col, strings.Join(k, "."), err)
			}
			return fmt.Errorf("%s:%d:%d: %w", path, row, col, err)
		}
		return fmt.Errorf("%s: %w", path, err)
	}
	entries := map[string]hostsFileEntry{"": f.hostsFileEntry}
	for k, v := range f.Host {
		entries[k] = v
	}
	for name, e := range entries {
		where := path
		if name != "" {
			where = fmt.Sprintf("%s: [host.%q]", path, name)
		}
		for _, c := range e.Capabilities {
			switch strings.ToLower(c) {
			case "pull", "resolve", "push", "referrers":
			default:
				return fmt.Errorf("%s: unknown capability %q (want pull, resolve, push or referrers)", where, c)
			}
		}
	}
	return nil
}

// CheckHostsDir checks every hosts.toml under root for what would fail a pull
// later: decoding and capabilities. Files a hosts.toml names (certificates) are
// read at pull time, as containerd does, so that they can be rotated without a
// reload. A root that does not exist configures nothing, as in containerd.
func CheckHostsDir(root string) error {
	if root == "" {
		return nil
	}
	entries, err := os.ReadDir(root)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("registry.config_path: %w", err)
	}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		if err := checkHostsFile(filepath.Join(root, e.Name())); err != nil {
			return fmt.Errorf("registry.config_path: %w", err)
		}
	}
	return nil
}

// hostsEndpoints returns the endpoints the host directory under p.hostsDir gives for
// registry domain, in order, with found false when no directory applies (then
// Config.Mirrors does). Files are read on every call, so edits apply to the next
// pull, as with containerd.
func (p *Puller) hostsEndpoints(ctx context.Context, domain string) (eps []endpoint, found bool, err error) {
	if p.hostsDir == "" {
		return nil, false, nil
	}
	dir, err := findHostDir(p.hostsDir, domain)
	if err != nil || dir == "" {
		return nil, false, err
	}
	if err := checkHostsFile(dir); err != nil {
		return nil, true, fmt.Errorf("registry host config for %s: %w: %w", domain, err, errdefs.ErrFailedPrecondition)
	}
	// containerd gives a host that configures TLS or a dial timeout a copy of the
	// default client with a transport of its own; UpdateClient sees the default
	// client first, then each copy before containerd may wrap its transport in an
	// HTTP fallback, so it is where each host's own transport can be taken.
	var defaultTr http.RoundTripper
	own := map[*http.Client]*http.Transport{}
	hosts, err := hostsconfig.ConfigureHosts(ctx, hostsconfig.HostOptions{
		HostDir: func(string) (string, error) { return dir, nil },
		UpdateClient: func(c *http.Client) error {
			if defaultTr == nil {
				defaultTr = c.Transport
				return nil
			}
			if tr, ok := c.Transport.(*http.Transport); ok && c.Transport != defaultTr {
				own[c] = tr
			}
			return nil
		},
	})(domain)
	if err != nil {
		return nil, true, fmt.Errorf("registry host config for %s (%s): %w: %w", domain, dir, err, errdefs.ErrFailedPrecondition)
	}
	for _, h := range hosts {
		if !h.Capabilities.Has(docker.HostCapabilityPull) {
			continue
		}
		ep := endpoint{
			host:    strings.ToLower(h.Host),
			apiRoot: h.Path,
			header:  h.Header,
			mirror:  canonicalHost(h.Host) != canonicalHost(domain),
			caps:    h.Capabilities,
			display: h.Scheme + "://" + h.Host + strings.TrimSuffix(h.Path, "/v2"),
			fromDir: dir,
		}
		if ep.apiRoot == "/v2" {
			ep.apiRoot = ""
		}
		ep.plainHTTP = h.Scheme == "http"
		if tr := own[h.Client]; tr != nil {
			// containerd turns an http host with TLS configured into https with a
			// fallback to http (its transport is then wrapped): plain HTTP stays
			// allowed for it, tried after HTTPS as go-containerregistry does.
			if _, plain := h.Client.Transport.(*http.Transport); !plain {
				ep.plainHTTP = true
			}
			ep.transport = hostTransport(tr)
		}
		eps = append(eps, ep)
	}
	if len(eps) == 0 {
		return nil, true, fmt.Errorf("registry host config for %s (%s): no host has the pull capability: %w", domain, dir, errdefs.ErrFailedPrecondition)
	}
	return eps, true, nil
}

// hostTransport adapts a host's own transport from containerd to crisp's rules:
// TLS 1.2 at least, and a bound on the wait for response headers.
func hostTransport(tr *http.Transport) *http.Transport {
	tr = tr.Clone()
	if tr.TLSClientConfig == nil {
		tr.TLSClientConfig = &tls.Config{}
	}
	if tr.TLSClientConfig.MinVersion < tls.VersionTLS12 {
		tr.TLSClientConfig.MinVersion = tls.VersionTLS12
	}
	tr.ResponseHeaderTimeout = responseHeaderTimeout
	tr.ForceAttemptHTTP2 = true
	return tr
}
