package remote

import (
	"context"
	"encoding/base64"
	"fmt"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/google/go-containerregistry/pkg/authn"
	ggcrremote "github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/crisp-runtime/crisp/internal/image/imagetest"
)

func basic(user, pass string) string {
	return base64.StdEncoding.EncodeToString([]byte(user + ":" + pass))
}

func TestAuthFileLookup(t *testing.T) {
	af := &authFile{Auths: map[string]authEntry{
		"https://index.docker.io/v1/":      {Username: "hub"},
		"registry.example":                 {Username: "host"},
		"registry.example/team":            {Username: "team"},
		"registry.example/team/app":        {Username: "app"},
		"http://plain.example:5000/":       {Username: "port"},
		"registry.example/teamwork/ignore": {Username: "other"},
	}}
	for _, tc := range []struct{ host, repo, want string }{
		{"docker.io", "library/busybox", "hub"},
		{"index.docker.io", "library/busybox", "hub"},
		{"registry.example", "team/app", "app"},
		{"registry.example", "team/app/sub", "app"},
		{"registry.example", "team/other", "team"},
		{"registry.example", "teamwork/x", "host"}, // a path prefix, not a string prefix
		{"registry.example", "solo", "host"},
		{"plain.example:5000", "x", "port"},
		{"plain.example", "x", ""},
		{"unknown.example", "x", ""},
	} {
		a, ok := af.lookup(tc.host, tc.repo)
		got := ""
		if ok {
			got = a.Username
		}
		if got != tc.want {
			t.Errorf("lookup(%s, %s) = %q, want %q", tc.host, tc.repo, got, tc.want)
		}
	}
}

func TestAuthFile(t *testing.T) {
	img := imagetest.BuildImage(t, twoLayerEntries()...)
	reg := imagetest.StartRegistry(t, imagetest.WithBasicAuth("node", "s3cret"))
	imagetest.Push(t, reg, "team/app:v1", img, ggcrremote.WithAuth(&authn.Basic{Username: "node", Password: "s3cret"}))
	tok := imagetest.StartRegistry(t, imagetest.WithTokenAuth(imagetest.TokenAuth{RefreshToken: "refresh-me", Token: "tok"}))
	imagetest.Push(t, tok, "team/app:v1", img, ggcrremote.WithAuth(&authn.Bearer{Token: "tok"}))

	dir := t.TempDir()
	for _, tc := range []struct {
		name, file string
		ref        string
		cri        *Auth
		want       string // "" succeeds
	}{
		{"host", fmt.Sprintf(`{"auths": {%q: {"auth": %q}}}`, reg, basic("node", "s3cret")), reg + "/team/app:v1", nil, ""},
		{"docker-url-key", fmt.Sprintf(`{"auths": {"http://%s/v1/": {"username": "node", "password": "s3cret"}}}`, reg), reg + "/team/app:v1", nil, ""},
		{"repo-beats-host", fmt.Sprintf(`{"auths": {%q: {"auth": %q}, "%s/team/app": {"auth": %q}}}`, reg, basic("node", "wrong"), reg, basic("node", "s3cret")), reg + "/team/app:v1", nil, ""},
		{"identity-token", fmt.Sprintf(`{"auths": {%q: {"identitytoken": "refresh-me"}}}`, tok), tok + "/team/app:v1", nil, ""},
		{"cri-wins", fmt.Sprintf(`{"auths": {%q: {"auth": %q}}}`, reg, basic("node", "s3cret")), reg + "/team/app:v1", &Auth{Username: "node", Password: "wrong"}, "rejected the credentials"},
		{"no-entry", `{"auths": {"other.example": {"auth": "` + basic("a", "b") + `"}}}`, reg + "/team/app:v1", nil, "requires credentials"},
		{"helpers-only", `{"credsStore": "desktop"}`, reg + "/team/app:v1", nil, "requires credentials"},
		{"bad-json", `{"auths": `, reg + "/team/app:v1", nil, "not a config.json"},
		{"bad-auth", `{"auths": {"x.example": {"auth": "%%%"}}}`, reg + "/team/app:v1", nil, "not valid base64"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := imagetest.WriteFile(t, dir, tc.name+".json", []byte(tc.file))
			p, cs := newPuller(t, Config{AuthFile: path})
			got, err := p.Pull(context.Background(), tc.ref, tc.cri)
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				checkPulled(t, cs, got, img)
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("pull: %v, want an error with %q", err, tc.want)
			}
			if strings.HasPrefix(tc.name, "bad") {
				if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), path) {
					t.Errorf("a bad auth file: %v, want FailedPrecondition naming %s", err, path)
				}
				if CheckAuthFile(path) == nil {
					t.Error("CheckAuthFile accepted it")
				}
			}
			if strings.Contains(err.Error(), "s3cret") || strings.Contains(err.Error(), basic("node", "s3cret")) {
				t.Errorf("the error shows a secret: %v", err)
			}
		})
	}
	// The file is read for every pull: a credential added later applies at once.
	path := imagetest.WriteFile(t, dir, "later.json", []byte(`{"auths": {}}`))
	p, _ := newPuller(t, Config{AuthFile: path})
	if _, err := p.Pull(context.Background(), reg+"/team/app:v1", nil); err == nil {
		t.Fatal("pull without credentials succeeded")
	}
	imagetest.WriteFile(t, dir, "later.json", []byte(fmt.Sprintf(`{"auths": {%q: {"auth": %q}}}`, reg, basic("node", "s3cret"))))
	if _, err := p.Pull(context.Background(), reg+"/team/app:v1", nil); err != nil {
		t.Fatalf("pull after the file got the credentials: %v", err)
	}
}
