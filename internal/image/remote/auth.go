package remote

import (
	"encoding/base64"
	"fmt"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/google/go-containerregistry/pkg/authn"
)

// Auth holds registry credentials as the CRI's AuthConfig carries them.
type Auth struct {
	Username      string
	Password      string
	Auth          string // base64 of "username:password", as in docker's config.json
	ServerAddress string // the registry the credentials are for; empty: the image's registry
	IdentityToken string // OAuth2 refresh token, exchanged for an access token
	RegistryToken string // bearer token sent to the registry as is
}

func (a *Auth) empty() bool {
	return a == nil || (a.Username == "" && a.Password == "" && a.Auth == "" && a.IdentityToken == "" && a.RegistryToken == "")
}

// credentials returns the authenticator to use towards host (an endpoint's host) when
// pulling from registry (the reference's domain). Credentials go only where they are
// meant to: the host named by ServerAddress, or the image's own registry when
// ServerAddress is empty; every other host (a mirror, say) is asked anonymously.
func (a *Auth) credentials(host, registry string) (authn.Authenticator, bool, error) {
	if a.empty() {
		return authn.Anonymous, false, nil
	}
	target := canonicalHost(registry)
	if a.ServerAddress != "" {
		target = hostOf(a.ServerAddress)
	}
	if canonicalHost(host) != target {
		return authn.Anonymous, false, nil
	}
	cfg := authn.AuthConfig{
		Username:      a.Username,
		Password:      a.Password,
		Auth:          a.Auth,
		IdentityToken: a.IdentityToken,
		RegistryToken: a.RegistryToken,
	}
	// A token service needs the user and password themselves, not the encoded pair.
	if cfg.Auth != "" && cfg.Username == "" && cfg.Password == "" {
		user, pass, err := decodeAuth(cfg.Auth)
		if err != nil {
			return nil, false, err
		}
		cfg.Username, cfg.Password = user, pass
	}
	return authn.FromConfig(cfg), true, nil
}

// decodeAuth decodes docker's "auth" field, base64("username:password"), padded or not.
func decodeAuth(field string) (user, pass string, err error) {
	field = strings.TrimSpace(field)
	b, err := base64.StdEncoding.DecodeString(field)
	if err != nil {
		b, err = base64.RawStdEncoding.DecodeString(field)
	}
	if err != nil {
		return "", "", fmt.Errorf("the credentials' auth field is not valid base64: %w", errdefs.ErrInvalidArgument)
	}
	user, pass, ok := strings.Cut(string(b), ":")
	if !ok {
		return "", "", fmt.Errorf("the credentials' auth field must encode \"username:password\": %w", errdefs.ErrInvalidArgument)
	}
	return user, pass, nil
}
