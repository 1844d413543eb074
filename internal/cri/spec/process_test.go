package spec

import (
	"testing"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestProcessArgs has containerd's TestContainerSpecCommand cases plus the docker
// details containerd keeps (an Entrypoint of [""] is no entrypoint).
func TestProcessArgs(t *testing.T) {
	for _, tc := range []struct {
		name                  string
		command, args         []string
		imgEntrypoint, imgCmd []string
		want                  []string
		wantErr               bool
	}{
		{name: "cri command replaces entrypoint and drops image cmd", command: []string{"a", "b"}, imgEntrypoint: []string{"c", "d"}, imgCmd: []string{"e", "f"}, want: []string{"a", "b"}},
		{name: "cri command set but empty drops entrypoint", command: []string{}, args: []string{"a", "b"}, imgEntrypoint: []string{"c", "d"}, imgCmd: []string{"e", "f"}, want: []string{"a", "b"}},
		{name: "cri command and args", command: []string{"a", "b"}, args: []string{"c", "d"}, imgEntrypoint: []string{"e", "f"}, imgCmd: []string{"g", "h"}, want: []string{"a", "b", "c", "d"}},
		{name: "cri args replace image cmd behind entrypoint", args: []string{"a", "b"}, imgEntrypoint: []string{"c", "d"}, imgCmd: []string{"e", "f"}, want: []string{"c", "d", "a", "b"}},
		{name: "image entrypoint and cmd", imgEntrypoint: []string{"c", "d"}, imgCmd: []string{"e", "f"}, want: []string{"c", "d", "e", "f"}},
		{name: "image cmd only", imgCmd: []string{"sh"}, want: []string{"sh"}},
		{name: "empty-string entrypoint is no entrypoint", imgEntrypoint: []string{""}, imgCmd: []string{"sh"}, want: []string{"sh"}},
		{name: "cri command without args ignores image cmd", command: []string{"sleep"}, imgCmd: []string{"sh"}, want: []string{"sleep"}},
		{name: "nothing at all", wantErr: true},
		{name: "empty-string entrypoint and nothing else", imgEntrypoint: []string{""}, wantErr: true},
		{name: "empty cri command and no image cmd", command: []string{}, imgEntrypoint: []string{"c"}, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := &runtime.ContainerConfig{Command: tc.command, Args: tc.args}
			got, err := processArgs(cfg, ocispec.ImageConfig{Entrypoint: tc.imgEntrypoint, Cmd: tc.imgCmd})
			if tc.wantErr {
				wantErr(t, err, isInvalid, "no command")
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			equal(t, "args", got, tc.want)
		})
	}
}

func TestGenerateNoCommand(t *testing.T) {
	setHost(t, defaultHost())
	in := baseInput(t)
	in.Image.Config.Cmd = nil
	_, err := Generate(in)
	wantErr(t, err, isInvalid, "no command to run")
}

func TestEnv(t *testing.T) {
	for _, tc := range []struct {
		name     string
		tty      bool
		hostname string
		imgEnv   []string
		envs     map[string]string // applied in key order below
		keys     []string
		want     []string
	}{
		{
			name:     "defaults",
			hostname: "pod-host",
			want:     []string{defaultPathEnv, "HOSTNAME=pod-host"},
		},
		{
			name:     "image path replaces default, cri overrides image by key",
			hostname: "h",
			imgEnv:   []string{"PATH=/bin", "A=image", "B=image"},
			keys:     []string{"B", "C"},
			envs:     map[string]string{"B": "cri", "C": "new"},
			want:     []string{"PATH=/bin", "HOSTNAME=h", "A=image", "B=cri", "C=new"},
		},
		{
			name:     "tty adds TERM, cri may override HOSTNAME",
			tty:      true,
			hostname: "h",
			keys:     []string{"HOSTNAME", "TERM"},
			envs:     map[string]string{"HOSTNAME": "mine", "TERM": "vt100"},
			want:     []string{defaultPathEnv, "TERM=vt100", "HOSTNAME=mine"},
		},
		{
			name:     "image entry without = unsets",
			hostname: "h",
			imgEnv:   []string{"HOSTNAME"},
			want:     []string{defaultPathEnv},
		},
		{
			name:     "empty value kept",
			hostname: "h",
			keys:     []string{"EMPTY"},
			envs:     map[string]string{"EMPTY": ""},
			want:     []string{defaultPathEnv, "HOSTNAME=h", "EMPTY="},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := &runtime.ContainerConfig{Tty: tc.tty}
			for _, k := range tc.keys {
				cfg.Envs = append(cfg.Envs, &runtime.KeyValue{Key: k, Value: []byte(tc.envs[k])})
			}
			got, err := processEnv(cfg, ocispec.ImageConfig{Env: tc.imgEnv}, tc.hostname)
			if err != nil {
				t.Fatal(err)
			}
			equal(t, "env", got, tc.want)
		})
	}
	_, err := processEnv(&runtime.ContainerConfig{Envs: []*runtime.KeyValue{{Key: "A=B"}}}, ocispec.ImageConfig{}, "h")
	wantErr(t, err, isInvalid, `env "A=B"`)
}

func TestGenerateEnvHostname(t *testing.T) {
	setHost(t, defaultHost())
	in := baseInput(t)
	res := mustGenerate(t, in)
	equal(t, "env", res.Spec.Process.Env, []string{defaultPathEnv, "HOSTNAME=pod-host"})
	if res.Spec.Hostname != "" {
		t.Errorf("hostname %q: UTS is joined from the pod, the spec must not set one", res.Spec.Hostname)
	}

	in.Pod.Hostname = ""
	res = mustGenerate(t, in)
	equal(t, "env", res.Spec.Process.Env, []string{defaultPathEnv, "HOSTNAME=node-1"})
}

func TestWorkingDirAndTerminal(t *testing.T) {
	setHost(t, defaultHost())
	for _, tc := range []struct {
		name, cri, image, want string
		wantErr                string
	}{
		{name: "cri wins", cri: "/work", image: "/img", want: "/work"},
		{name: "image", image: "/img/", want: "/img"},
		{name: "relative image dir is under /", image: "app", want: "/app"},
		{name: "default", want: "/"},
		{name: "relative cri dir refused", cri: "work", wantErr: `working_dir "work"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := baseInput(t)
			in.Config.WorkingDir = tc.cri
			in.Image.Config.WorkingDir = tc.image
			if tc.wantErr != "" {
				_, err := Generate(in)
				wantErr(t, err, isInvalid, tc.wantErr)
				return
			}
			equal(t, "cwd", mustGenerate(t, in).Spec.Process.Cwd, tc.want)
		})
	}
	in := baseInput(t)
	in.Config.Tty, in.Config.Stdin, in.Config.StdinOnce = true, true, true
	if !mustGenerate(t, in).Spec.Process.Terminal {
		t.Error("tty: want terminal")
	}
	if mustGenerate(t, baseInput(t)).Spec.Process.Terminal {
		t.Error("no tty: want no terminal")
	}
}
