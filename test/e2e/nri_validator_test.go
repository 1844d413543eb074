package e2e

import (
	"context"
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"
	"google.golang.org/grpc/status"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// validatorTOML is the [default_validator] table both runtimes get: every rejection on,
// one required plugin that is never there, and an annotation that tolerates its absence.
const validatorTOML = `enable = true
reject_oci_hook_adjustment = true
reject_namespace_adjustment = true
reject_sysctl_adjustment = true
reject_runtime_default_seccomp_adjustment = true
reject_unconfined_seccomp_adjustment = true
reject_custom_seccomp_adjustment = true
required_plugins = ["absent"]
tolerate_missing_plugins_annotation = "e2e.crisp/tolerate-missing"
`

// nameAdjuster adjusts each container as its name says.
type nameAdjuster struct{ *nriSyncer }

func (nameAdjuster) CreateContainer(_ context.Context, _ *api.PodSandbox, c *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	a := &api.ContainerAdjustment{}
	switch strings.TrimSuffix(c.GetName(), "-strict") {
	case "hook":
		a.AddHooks(&api.Hooks{Prestart: []*api.Hook{{Path: "/bin/true"}}})
	case "netns":
		a.AddOrReplaceNamespace(&api.LinuxNamespace{Type: "network", Path: "/proc/1/ns/net"})
	case "sysctl":
		a.SetLinuxSysctl("net.ipv4.ip_forward", "1")
	case "seccomp-rd", "seccomp-unconfined":
		a.SetLinuxSeccompPolicy(&api.LinuxSeccomp{DefaultAction: "SCMP_ACT_ALLOW"})
	default:
		a.SetLinuxMemoryLimit(64 << 20)
	}
	return a, nil, nil
}

// validatorCase is one container of the scenario and whether the validator lets it be.
type validatorCase struct {
	name    string
	seccomp cri.SecurityProfile_ProfileType
	strict  bool   // in the pod without the tolerate annotation
	refusal string // "" created, else a part of the error
}

var validatorCases = []validatorCase{
	{"hook", cri.SecurityProfile_RuntimeDefault, false, "OCI hook injection"},
	{"netns", cri.SecurityProfile_RuntimeDefault, false, "namespace adjustment"},
	{"sysctl", cri.SecurityProfile_RuntimeDefault, false, "sysctl adjustment"},
	{"seccomp-rd", cri.SecurityProfile_RuntimeDefault, false, "runtime default seccomp"},
	{"seccomp-unconfined", cri.SecurityProfile_Unconfined, false, "unconfined seccomp"},
	{"plain", cri.SecurityProfile_RuntimeDefault, false, ""},
	{"plain", cri.SecurityProfile_RuntimeDefault, true, `required plugin "absent" not present`},
}

// validatorOutcome is what a runtime answered one case: the gRPC code and message.
type validatorOutcome struct {
	code string
	msg  string
}

// runValidatorCases creates each case's container in pods made by runPod (tolerant
// or strict) and returns what the runtime answered.
func runValidatorCases(t *testing.T, rt cri.RuntimeServiceClient, runPod func(name string, ann map[string]string) (string, *cri.PodSandboxConfig), ctrCfg func(name string) *cri.ContainerConfig) []validatorOutcome {
	t.Helper()
	ctx := ctxT(t)
	tolerantID, tolerant := runPod("validator", map[string]string{"e2e.crisp/tolerate-missing": "true"})
	strictID, strict := runPod("validator-strict", nil)
	var out []validatorOutcome
	for _, tc := range validatorCases {
		podID, pod, name := tolerantID, tolerant, tc.name
		if tc.strict {
			podID, pod, name = strictID, strict, tc.name+"-strict"
		}
		cfg := ctrCfg(name)
		cfg.Linux.SecurityContext.Seccomp = &cri.SecurityProfile{ProfileType: tc.seccomp}
		_, err := rt.CreateContainer(ctx, &cri.CreateContainerRequest{PodSandboxId: podID, Config: cfg, SandboxConfig: pod})
		st, _ := status.FromError(err)
		out = append(out, validatorOutcome{code: st.Code().String(), msg: st.Message()})
	}
	return out
}

// checkValidatorOutcomes checks one runtime's answers against the cases.
func checkValidatorOutcomes(t *testing.T, runtime string, got []validatorOutcome) {
	t.Helper()
	for i, tc := range validatorCases {
		o := got[i]
		t.Logf("%s: %s (strict %v): %s %s", runtime, tc.name, tc.strict, o.code, o.msg)
		switch {
		case tc.refusal == "" && o.code != "OK":
			t.Errorf("%s: container %s refused: %s %s", runtime, tc.name, o.code, o.msg)
		case tc.refusal != "" && !strings.Contains(o.msg, tc.refusal):
			t.Errorf("%s: container %s: %s %q, want a refusal with %q", runtime, tc.name, o.code, o.msg, tc.refusal)
		}
	}
}

// TestE2ENRIValidator: [nri.default_validator] with every rejection on refuses the
// same adjustments in crisp as in containerd 2.4.2 with the same table, and lets
// the same through; crisp's refusals are FailedPrecondition.
func TestE2ENRIValidator(t *testing.T) {
	n := newNRIEnv(t, "2s")
	n.appendConfig("[nri.default_validator]\n" + validatorTOML)
	n.start()
	ctx := ctxT(t)
	img := n.busybox(ctx)
	p := nameAdjuster{&nriSyncer{synced: make(chan struct{})}}
	n.connectPlugin(t, "adjuster", "10", p, p.synced)
	crisp := runValidatorCases(t, n.rt, func(name string, ann map[string]string) (string, *cri.PodSandboxConfig) {
		pod := n.podConfig(name)
		pod.Annotations = ann
		id := n.runPod(ctx, pod)
		t.Cleanup(func() { n.stopRemove(context.Background(), t, id) })
		return id, pod
	}, func(name string) *cri.ContainerConfig { return ctrConfig(name, img, "sleep", "3600") })
	checkValidatorOutcomes(t, "crisp", crisp)
	for i, tc := range validatorCases {
		if tc.refusal != "" && crisp[i].code != "FailedPrecondition" {
			t.Errorf("crisp: container %s refused with %s, want FailedPrecondition", tc.name, crisp[i].code)
		}
	}

	var socket string
	c := newContainerd(t, withContainerdNRI(&socket, "1s"), func(c *ctrd, config *string) {
		const section = "[plugins.'io.containerd.nri.v1.nri']\n"
		if !strings.Contains(*config, section) {
			t.Fatal("containerd's config has no NRI section")
		}
		// After the section's keys: the next table header, or the end.
		at := strings.Index(*config, section) + len(section)
		next := strings.Index((*config)[at:], "\n[")
		if next < 0 {
			next = len(*config) - at
		}
		table := "\n[plugins.'io.containerd.nri.v1.nri'.default_validator]\n" + validatorTOML
		*config = (*config)[:at+next] + table + (*config)[at+next:]
	})
	if _, err := c.img.PullImage(ctx, &cri.PullImageRequest{Image: &cri.ImageSpec{Image: c.busybox}}); err != nil {
		t.Fatalf("pull busybox: %v\n%s", err, c.logTail(4000))
	}
	cn := &nriEnv{nriSocket: socket, env: &env{t: t, logPath: c.logPath}}
	cp := nameAdjuster{&nriSyncer{synced: make(chan struct{})}}
	cn.connectPlugin(t, "adjuster", "10", cp, cp.synced)
	ctrd := runValidatorCases(t, c.rt, func(name string, ann map[string]string) (string, *cri.PodSandboxConfig) {
		pod := c.podConfig(name)
		pod.Annotations = ann
		id := c.runPod(ctx, t, pod, "runc")
		t.Cleanup(func() { c.removePod(context.Background(), t, id) })
		return id, pod
	}, func(name string) *cri.ContainerConfig { return c.ctrConfig(name, "sleep", "3600") })
	checkValidatorOutcomes(t, "containerd", ctrd)
}
