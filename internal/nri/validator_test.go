package nri

import (
	"context"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/containerd/nri/pkg/api"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/crisp-runtime/crisp/internal/config"
)

// adjustBy adjusts every container with adj.
type adjustBy struct {
	*syncer
	adj func(*api.ContainerAdjustment)
}

func (p *adjustBy) CreateContainer(context.Context, *api.PodSandbox, *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	a := &api.ContainerAdjustment{}
	p.adj(a)
	return a, nil, nil
}

func addHook(a *api.ContainerAdjustment) {
	a.AddHooks(&api.Hooks{Prestart: []*api.Hook{{Path: "/bin/true"}}})
}
func addNetNS(a *api.ContainerAdjustment) {
	a.AddOrReplaceNamespace(&api.LinuxNamespace{Type: "network", Path: "/proc/1/ns/net"})
}
func removeUserNS(a *api.ContainerAdjustment) { a.RemoveNamespace(&api.LinuxNamespace{Type: "user"}) }
func addSysctl(a *api.ContainerAdjustment)    { a.SetLinuxSysctl("net.ipv4.ip_forward", "1") }
func setSeccomp(a *api.ContainerAdjustment) {
	a.SetLinuxSeccompPolicy(&api.LinuxSeccomp{DefaultAction: "SCMP_ACT_ALLOW"})
}
func setMemory(a *api.ContainerAdjustment) { a.SetLinuxMemoryLimit(64 << 20) }

func profile(t runtime.SecurityProfile_ProfileType, ref string) *runtime.SecurityProfile {
	return &runtime.SecurityProfile{ProfileType: t, LocalhostRef: ref}
}

// TestDefaultValidator: [nri.default_validator] refuses each kind of adjustment its
// key names, and only when it is on, as containerd 2.4's does (the library's
// validator: test/e2e compares the two runtimes).
func TestDefaultValidator(t *testing.T) {
	all := config.NRIValidatorConfig{
		Enable: true, RejectOCIHookAdjustment: true, RejectNamespaceAdjustment: true, RejectSysctlAdjustment: true,
		RejectRuntimeDefaultSeccompAdjustment: true, RejectUnconfinedSeccompAdjustment: true, RejectCustomSeccompAdjustment: true,
	}
	off := all
	off.Enable = false
	onlyCustom := config.NRIValidatorConfig{Enable: true, RejectCustomSeccompAdjustment: true}
	required := config.NRIValidatorConfig{Enable: true, RequiredPlugins: []string{"absent"}, TolerateMissingAnnotation: "example.com/tolerate-missing"}
	rd, unconfined, local := profile(runtime.SecurityProfile_RuntimeDefault, ""), profile(runtime.SecurityProfile_Unconfined, ""), profile(runtime.SecurityProfile_Localhost, "/p.json")
	for _, tc := range []struct {
		name    string
		cfg     config.NRIValidatorConfig
		adj     func(*api.ContainerAdjustment)
		seccomp *runtime.SecurityProfile
		podAnn  map[string]string
		want    string // "" accepted, else a part of the refusal
	}{
		{"hook refused", all, addHook, rd, nil, "OCI hook injection"},
		{"namespace added refused", all, addNetNS, rd, nil, "namespace adjustment"},
		{"user namespace removed refused", all, removeUserNS, rd, nil, "namespace adjustment"},
		{"sysctl refused", all, addSysctl, rd, nil, "sysctl adjustment"},
		{"seccomp of RuntimeDefault refused", all, setSeccomp, rd, nil, "runtime default seccomp"},
		{"seccomp of Unconfined refused", all, setSeccomp, unconfined, nil, "unconfined seccomp"},
		{"seccomp of no profile refused as Unconfined", all, setSeccomp, nil, nil, "unconfined seccomp"},
		{"seccomp of Localhost refused", all, setSeccomp, local, nil, "custom seccomp"},
		{"seccomp of RuntimeDefault allowed by its key", onlyCustom, setSeccomp, rd, nil, ""},
		{"resources always allowed", all, setMemory, rd, nil, ""},
		{"validator off allows hooks", off, addHook, rd, nil, ""},
		{"validator off allows namespaces", off, addNetNS, rd, nil, ""},
		{"required plugin missing", required, setMemory, rd, nil, `required plugin "absent" not present`},
		{"required plugin missing, tolerated", required, setMemory, rd, map[string]string{"example.com/tolerate-missing": "true"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.DefaultValidator = tc.cfg
			n := startNRI(t, cfg, newTestRuntime())
			startPlugin(t, n, cfg.SocketPath, "adjuster", "10", &adjustBy{syncer: newSyncer(), adj: tc.adj})
			p := Pod{ID: "p", Name: "p", Annotations: tc.podAnn}
			_, err := n.CreateContainer(context.Background(), p, Container{ID: "c", PodID: "p", Name: "c", Spec: testSpec(), Seccomp: tc.seccomp})
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("CreateContainer refused: %v", err)
			case tc.want != "" && err == nil:
				t.Fatalf("CreateContainer accepted; want a refusal with %q", tc.want)
			case tc.want != "" && !strings.Contains(err.Error(), tc.want):
				t.Fatalf("CreateContainer: %v; want %q", err, tc.want)
			case tc.want != "" && !errdefs.IsFailedPrecondition(err):
				t.Errorf("CreateContainer: %v is not a FailedPrecondition", err)
			}
		})
	}
}
