//lint:file-ignore SA1019 the deprecated apparmor_profile string is still honoured and tested.

package spec

import (
	"errors"
	"fmt"
	"testing"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// fakeAppArmor is a host with AppArmor: the default profile loads (or fails with
// loadErr), and the profiles in loaded are loaded.
type fakeAppArmor struct {
	loaded  map[string]bool
	loadErr error
	loads   int
}

func (f *fakeAppArmor) EnsureDefault() (string, error) {
	f.loads++
	if f.loadErr != nil {
		return "", f.loadErr
	}
	return "crisp-default", nil
}

func (f *fakeAppArmor) Loaded(name string) (bool, error) { return f.loaded[name], nil }

func TestAppArmorFor(t *testing.T) {
	prof := func(k runtime.SecurityProfile_ProfileType, ref string) *runtime.SecurityProfile {
		return &runtime.SecurityProfile{ProfileType: k, LocalhostRef: ref}
	}
	const (
		def   = runtime.SecurityProfile_RuntimeDefault
		unc   = runtime.SecurityProfile_Unconfined
		local = runtime.SecurityProfile_Localhost
	)
	for _, tc := range []struct {
		name       string
		sc         *runtime.LinuxContainerSecurityContext
		noAppArmor bool
		want       string
		warn       bool
		errIs      func(error) bool
		errText    string
	}{
		{name: "unset gets the default", sc: &runtime.LinuxContainerSecurityContext{}, want: "crisp-default"},
		{name: "nil security context gets the default", sc: nil, want: "crisp-default"},
		{name: "RuntimeDefault", sc: &runtime.LinuxContainerSecurityContext{Apparmor: prof(def, "")}, want: "crisp-default"},
		{name: "Unconfined", sc: &runtime.LinuxContainerSecurityContext{Apparmor: prof(unc, "")}, want: ""},
		{name: "Localhost loaded", sc: &runtime.LinuxContainerSecurityContext{Apparmor: prof(local, "deny-write")}, want: "deny-write"},
		{name: "Localhost with the localhost/ prefix", sc: &runtime.LinuxContainerSecurityContext{Apparmor: prof(local, "localhost/deny-write")}, want: "deny-write"},
		{name: "Localhost not loaded", sc: &runtime.LinuxContainerSecurityContext{Apparmor: prof(local, "nope")}, errIs: isFailedPrecondition, errText: "apparmor profile not found nope: load it on the node (apparmor_parser) before creating the container"},
		{name: "Localhost without a ref", sc: &runtime.LinuxContainerSecurityContext{Apparmor: prof(local, "")}, errIs: isInvalid},
		{name: "a ref with RuntimeDefault", sc: &runtime.LinuxContainerSecurityContext{Apparmor: prof(def, "x")}, errIs: isInvalid},
		{name: "unknown type", sc: &runtime.LinuxContainerSecurityContext{Apparmor: prof(7, "")}, errIs: isInvalid},
		{name: "deprecated runtime/default", sc: &runtime.LinuxContainerSecurityContext{ApparmorProfile: "runtime/default"}, want: "crisp-default"},
		{name: "deprecated unconfined", sc: &runtime.LinuxContainerSecurityContext{ApparmorProfile: "unconfined"}, want: ""},
		{name: "deprecated localhost/", sc: &runtime.LinuxContainerSecurityContext{ApparmorProfile: "localhost/deny-write"}, want: "deny-write"},
		{name: "deprecated localhost/ not loaded", sc: &runtime.LinuxContainerSecurityContext{ApparmorProfile: "localhost/nope"}, errIs: isFailedPrecondition},
		{name: "deprecated without a prefix", sc: &runtime.LinuxContainerSecurityContext{ApparmorProfile: "deny-write"}, errIs: isInvalid, errText: `invalid apparmor profile "deny-write": want "runtime/default", "unconfined" or "localhost/"<name>`},
		{name: "deprecated empty localhost/", sc: &runtime.LinuxContainerSecurityContext{ApparmorProfile: "localhost/"}, errIs: isInvalid},
		{name: "the field wins over the string", sc: &runtime.LinuxContainerSecurityContext{Apparmor: prof(unc, ""), ApparmorProfile: "localhost/deny-write"}, want: ""},
		{name: "the field wins, Localhost", sc: &runtime.LinuxContainerSecurityContext{Apparmor: prof(local, "deny-write"), ApparmorProfile: "unconfined"}, want: "deny-write"},
		{name: "no AppArmor: unset", sc: &runtime.LinuxContainerSecurityContext{}, noAppArmor: true, want: ""},
		{name: "no AppArmor: Unconfined", sc: &runtime.LinuxContainerSecurityContext{Apparmor: prof(unc, "")}, noAppArmor: true, want: ""},
		{name: "no AppArmor: RuntimeDefault", sc: &runtime.LinuxContainerSecurityContext{Apparmor: prof(def, "")}, noAppArmor: true, errIs: isFailedPrecondition,
			errText: "apparmor profile RuntimeDefault requested, but AppArmor is not enabled on this node (or criserver has disable_apparmor set)"},
		{name: "no AppArmor: deprecated localhost/", sc: &runtime.LinuxContainerSecurityContext{ApparmorProfile: "localhost/x"}, noAppArmor: true, errIs: isFailedPrecondition},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var aa AppArmor
			if !tc.noAppArmor {
				aa = &fakeAppArmor{loaded: map[string]bool{"deny-write": true}}
			}
			got, warning, err := apparmorFor(tc.sc, aa)
			if tc.errIs != nil {
				if err == nil || !tc.errIs(err) {
					t.Fatalf("err %v, want a different kind", err)
				}
				if tc.errText != "" && err.Error() != tc.errText {
					t.Errorf("err %q\nwant %q", err, tc.errText)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want || (warning != "") != tc.warn {
				t.Errorf("profile %q warning %q, want %q (warning %v)", got, warning, tc.want, tc.warn)
			}
		})
	}
}

// TestAppArmorForPrivileged: a privileged container gets what containerd gives it
// (no default profile; a Localhost profile it names), and the outcome depends only on
// whether the host can give what was asked: nothing is refused that would run the same
// with AppArmor on, nothing asked for is dropped. Each request through the apparmor
// field and the deprecated string.
func TestAppArmorForPrivileged(t *testing.T) {
	const (
		notFound = "apparmor profile not found nope: load it on the node (apparmor_parser) before creating the container"
		noAA     = "apparmor profile localhost/%s requested, but AppArmor is not enabled on this node (or criserver has disable_apparmor set)"
	)
	type outcome struct {
		profile string
		warn    bool
		errText string // FailedPrecondition with this message
	}
	for _, tc := range []struct {
		name    string
		field   *runtime.SecurityProfile
		str     string
		on, off outcome
	}{
		{name: "unset", on: outcome{}, off: outcome{}},
		{name: "RuntimeDefault", field: &runtime.SecurityProfile{ProfileType: runtime.SecurityProfile_RuntimeDefault}, str: "runtime/default",
			on: outcome{warn: true}, off: outcome{warn: true}},
		{name: "Unconfined", field: &runtime.SecurityProfile{ProfileType: runtime.SecurityProfile_Unconfined}, str: "unconfined",
			on: outcome{}, off: outcome{}},
		{name: "Localhost loaded", field: &runtime.SecurityProfile{ProfileType: runtime.SecurityProfile_Localhost, LocalhostRef: "deny-write"}, str: "localhost/deny-write",
			on: outcome{profile: "deny-write"}, off: outcome{errText: fmt.Sprintf(noAA, "deny-write")}},
		{name: "Localhost not loaded", field: &runtime.SecurityProfile{ProfileType: runtime.SecurityProfile_Localhost, LocalhostRef: "nope"}, str: "localhost/nope",
			on: outcome{errText: notFound}, off: outcome{errText: fmt.Sprintf(noAA, "nope")}},
	} {
		for _, form := range []string{"field", "string"} {
			if tc.field == nil && form == "string" {
				continue
			}
			for _, aaOn := range []bool{true, false} {
				want, host := tc.on, "AppArmor on"
				if !aaOn {
					want, host = tc.off, "AppArmor off"
				}
				t.Run(tc.name+"/"+form+"/"+host, func(t *testing.T) {
					sc := &runtime.LinuxContainerSecurityContext{Privileged: true}
					if form == "field" {
						sc.Apparmor = tc.field
					} else {
						sc.ApparmorProfile = tc.str
					}
					var aa AppArmor
					fake := &fakeAppArmor{loaded: map[string]bool{"deny-write": true}}
					if aaOn {
						aa = fake
					}
					got, warning, err := apparmorFor(sc, aa)
					if want.errText != "" {
						if !isFailedPrecondition(err) || err.Error() != want.errText {
							t.Fatalf("err %v\nwant FailedPrecondition %q", err, want.errText)
						}
						return
					}
					if err != nil {
						t.Fatalf("err %v, want profile %q", err, want.profile)
					}
					if got != want.profile || (warning != "") != want.warn {
						t.Errorf("profile %q warning %q, want %q (warning %v)", got, warning, want.profile, want.warn)
					}
					if fake.loads != 0 {
						t.Errorf("the default profile was loaded for a privileged container")
					}
				})
			}
		}
	}
}

func TestAppArmorDefaultLoadFails(t *testing.T) {
	aa := &fakeAppArmor{loadErr: errors.New("apparmor_parser: exit 1")}
	if _, _, err := apparmorFor(&runtime.LinuxContainerSecurityContext{}, aa); err == nil {
		t.Fatal("a default profile that cannot be loaded was not an error")
	}
	if aa.loads != 1 {
		t.Errorf("%d loads, want 1", aa.loads)
	}
}

func TestGenerateAppArmor(t *testing.T) {
	setHost(t, defaultHost())
	in := baseInput(t)
	in.AppArmor = &fakeAppArmor{}
	if res := mustGenerate(t, in); res.Spec.Process.ApparmorProfile != "crisp-default" {
		t.Errorf("profile %q, want crisp-default", res.Spec.Process.ApparmorProfile)
	}
}
