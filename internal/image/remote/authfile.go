package remote

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
)

// maxAuthFileSize bounds what is read of the node's auth file; real ones are a few KiB.
const maxAuthFileSize = 4 << 20

// authFile is the node's credentials file in the Docker config.json and
// containers-auth.json(5) format: "auths" keyed by registry host, or by
// host/namespace/repository for credentials of one repository.
type authFile struct {
	Auths map[string]authEntry `json:"auths"`
	// Credential helpers are run by neither crisp nor kubelet's CRI; their presence
	// is reported so that an empty lookup is not a mystery.
	CredsStore  string            `json:"credsStore"`
	CredHelpers map[string]string `json:"credHelpers"`
}

type authEntry struct {
	Auth          string `json:"auth"`
	Username      string `json:"username"`
	Password      string `json:"password"`
	IdentityToken string `json:"identitytoken"`
	RegistryToken string `json:"registrytoken"`
}

// readAuthFile reads and checks path. Its errors name the file and the entry, never
// a secret.
func readAuthFile(path string) (*authFile, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("registry.auth_file: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxAuthFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("registry.auth_file %s: %w", path, err)
	}
	if len(b) > maxAuthFileSize {
		return nil, fmt.Errorf("registry.auth_file %s: larger than %d bytes", path, maxAuthFileSize)
	}
	var af authFile
	if err := json.Unmarshal(b, &af); err != nil {
		return nil, fmt.Errorf("registry.auth_file %s: not a config.json: %w", path, err)
	}
	for key, e := range af.Auths {
		if authKey(key) == "" {
			return nil, fmt.Errorf("registry.auth_file %s: auths entry %q names no registry", path, key)
		}
		if e.Auth != "" {
			if _, _, err := decodeAuth(e.Auth); err != nil {
				return nil, fmt.Errorf("registry.auth_file %s: auths entry %q: %w", path, key, err)
			}
		}
	}
	return &af, nil
}

// CheckAuthFile reads path as an auth file, for a configuration check. A file that
// does not exist is fine: it holds no credentials (yet), as for containers/image.
func CheckAuthFile(path string) error {
	if path == "" {
		return nil
	}
	_, err := readAuthFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

// authKey normalizes an auths key: the scheme and docker's "/v1/" path go, Docker
// Hub's names fold into docker.io, and a repository path stays.
func authKey(key string) string {
	host, path := splitRegistryPath(key)
	if path == "v1" || path == "v2" {
		path = ""
	}
	if host == "" {
		return ""
	}
	if path == "" {
		return host
	}
	return host + "/" + path
}

// lookup returns the credentials for repository repo (a path, "library/busybox")
// on host: the most specific entry wins, host/namespace/repo before host/namespace
// before host, as containers-auth.json(5) says.
func (af *authFile) lookup(host, repo string) (*Auth, bool) {
	host = canonicalHost(host)
	byKey := make(map[string]authEntry, len(af.Auths))
	for k, e := range af.Auths {
		byKey[authKey(k)] = e
	}
	parts := strings.Split(repo, "/")
	for n := len(parts); n >= 0; n-- {
		key := host
		if n > 0 {
			key += "/" + strings.Join(parts[:n], "/")
		}
		if e, ok := byKey[key]; ok {
			return &Auth{Username: e.Username, Password: e.Password, Auth: e.Auth, IdentityToken: e.IdentityToken, RegistryToken: e.RegistryToken, ServerAddress: host}, true
		}
	}
	return nil, false
}
