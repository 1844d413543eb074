package spec

import (
	"syscall"
	"testing"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/proto"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func ptr[T any](v T) *T { return &v }

func TestResources(t *testing.T) {
	full := &runtime.LinuxContainerResources{
		CpuPeriod:          100000,
		CpuQuota:           50000,
		CpuShares:          512,
		CpusetCpus:         "0-1",
		CpusetMems:         "0",
		MemoryLimitInBytes: 256 << 20,
		HugepageLimits:     []*runtime.HugepageLimit{{PageSize: "2MB", Limit: 4 << 20}, {PageSize: "1GB", Limit: 0}},
		Unified:            map[string]string{"memory.high": "200000000"},
	}
	for _, tc := range []struct {
		name         string
		host         func(*host)
		res          *runtime.LinuxContainerResources
		want         *specs.LinuxResources
		wantWarnings int
		wantErr      string
	}{
		{name: "none", res: nil, want: &specs.LinuxResources{}},
		{name: "zero values are not set", res: &runtime.LinuxContainerResources{}, want: &specs.LinuxResources{}},
		{
			name: "everything, swap equal to memory by default",
			res:  full,
			want: &specs.LinuxResources{
				CPU:            &specs.LinuxCPU{Period: ptr(uint64(100000)), Quota: ptr(int64(50000)), Shares: ptr(uint64(512)), Cpus: "0-1", Mems: "0"},
				Memory:         &specs.LinuxMemory{Limit: ptr(int64(256 << 20)), Swap: ptr(int64(256 << 20))},
				HugepageLimits: []specs.LinuxHugepageLimit{{Pagesize: "2MB", Limit: 4 << 20}, {Pagesize: "1GB", Limit: 0}},
				Unified:        map[string]string{"memory.high": "200000000"},
			},
		},
		{
			name: "explicit swap limit",
			res:  &runtime.LinuxContainerResources{MemoryLimitInBytes: 100, MemorySwapLimitInBytes: 300},
			want: &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: ptr(int64(100)), Swap: ptr(int64(300))}},
		},
		{
			name:         "no swap accounting: swap left out, explicit swap warned",
			host:         func(h *host) { h.swap = false },
			res:          &runtime.LinuxContainerResources{MemoryLimitInBytes: 100, MemorySwapLimitInBytes: 300},
			want:         &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: ptr(int64(100))}},
			wantWarnings: 1,
		},
		{
			name:         "no hugetlb controller: limits skipped with a warning",
			host:         func(h *host) { h.hugetlb = false },
			res:          &runtime.LinuxContainerResources{HugepageLimits: []*runtime.HugepageLimit{{PageSize: "2MB"}}},
			want:         &specs.LinuxResources{},
			wantWarnings: 1,
		},
		{name: "unlimited quota", res: &runtime.LinuxContainerResources{CpuQuota: -1}, want: &specs.LinuxResources{CPU: &specs.LinuxCPU{Quota: ptr(int64(-1))}}},
		{name: "unified on cgroup v1", host: func(h *host) { h.cgroup2 = false }, res: full, wantErr: "unified cgroup settings (memory.high) need cgroup v2"},
		{name: "negative shares", res: &runtime.LinuxContainerResources{CpuShares: -2}, wantErr: "cpu_shares -2 must not be negative"},
		{name: "negative memory", res: &runtime.LinuxContainerResources{MemoryLimitInBytes: -1}, wantErr: "memory_limit_in_bytes -1"},
		{name: "bad quota", res: &runtime.LinuxContainerResources{CpuQuota: -5}, wantErr: "cpu_quota -5"},
		{name: "bad page size", res: &runtime.LinuxContainerResources{HugepageLimits: []*runtime.HugepageLimit{{PageSize: "huge"}}}, wantErr: `page_size "huge"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := defaultHost()
			if tc.host != nil {
				tc.host(&h)
			}
			setHost(t, h)

			// UpdateContainerResources: only the resources, no device rules.
			got, err := UpdateResources(tc.res)
			if tc.wantErr != "" {
				wantErr(t, err, isInvalid, tc.wantErr)
			} else if err != nil {
				t.Fatal(err)
			} else {
				equal(t, "update resources", got, tc.want)
			}

			in := baseInput(t)
			in.Config.Linux.Resources = tc.res
			if tc.wantErr != "" {
				_, err := Generate(in)
				wantErr(t, err, isInvalid, tc.wantErr)
				return
			}
			res := mustGenerate(t, in)
			r := *res.Spec.Linux.Resources
			r.Devices = nil
			equal(t, "spec resources", &r, tc.want)
			if len(res.Warnings) != tc.wantWarnings {
				t.Errorf("warnings %q, want %d", res.Warnings, tc.wantWarnings)
			}
		})
	}
}

func TestOOMScoreAdj(t *testing.T) {
	setHost(t, defaultHost())
	for _, tc := range []struct {
		name    string
		res     *runtime.LinuxContainerResources
		floor   int
		want    *int
		warn    bool
		wantErr string
	}{
		{name: "no resources: inherited", res: nil, want: nil},
		{name: "kept", res: &runtime.LinuxContainerResources{OomScoreAdj: 1000}, floor: -998, want: ptr(1000)},
		{name: "zero is a value", res: &runtime.LinuxContainerResources{}, floor: -998, want: ptr(0)},
		{name: "at the floor", res: &runtime.LinuxContainerResources{OomScoreAdj: -500}, floor: -500, want: ptr(-500)},
		{name: "clamped", res: &runtime.LinuxContainerResources{OomScoreAdj: -997}, floor: -500, want: ptr(-500), warn: true},
		{name: "out of range", res: &runtime.LinuxContainerResources{OomScoreAdj: 1001}, wantErr: "oom_score_adj 1001 is out of range"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := baseInput(t)
			in.Config.Linux.Resources, in.OOMScoreAdjFloor = tc.res, tc.floor
			if tc.wantErr != "" {
				_, err := Generate(in)
				wantErr(t, err, isInvalid, tc.wantErr)
				return
			}
			res := mustGenerate(t, in)
			equal(t, "oom_score_adj", res.Spec.Process.OOMScoreAdj, tc.want)
			if got := len(res.Warnings) == 1; got != tc.warn {
				t.Errorf("warnings %q", res.Warnings)
			}
		})
	}
}

func TestStopSignal(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cri     runtime.Signal
		image   string
		want    syscall.Signal
		wantErr string
	}{
		{name: "default is SIGTERM", want: syscall.SIGTERM},
		{name: "image name", image: "SIGQUIT", want: syscall.SIGQUIT},
		{name: "image short name", image: "usr1", want: syscall.SIGUSR1},
		{name: "image number", image: "9", want: syscall.SIGKILL},
		{name: "image alias", image: "SIGCLD", want: syscall.SIGCHLD},
		{name: "image real-time", image: "SIGRTMIN+3", want: syscall.Signal(37)},
		{name: "image real-time from max", image: "RTMAX-1", want: syscall.Signal(63)},
		{name: "cri wins over image", cri: runtime.Signal_SIGNAL_SIGINT, image: "SIGQUIT", want: syscall.SIGINT},
		{name: "cri real-time", cri: runtime.Signal_SIGNAL_SIGRTMINPLUS2, want: syscall.Signal(36)},
		{name: "cri real-time max minus", cri: runtime.Signal_SIGNAL_SIGRTMAXMINUS14, want: syscall.Signal(50)},
		{name: "cri SIGRTMAX", cri: runtime.Signal_SIGNAL_SIGRTMAX, want: syscall.Signal(64)},
		{name: "bad image signal", image: "SIGFOO", wantErr: `the image's STOPSIGNAL "SIGFOO"`},
		{name: "image number out of range", image: "65", wantErr: "out of range"},
		{name: "image real-time out of range", image: "SIGRTMAX+1", wantErr: "out of the real-time range"},
		{name: "unknown cri signal", cri: runtime.Signal(999), wantErr: "unknown CRI stop_signal 999"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := &runtime.ContainerConfig{StopSignal: tc.cri}
			got, err := StopSignal(cfg, ocispec.Image{Config: ocispec.ImageConfig{StopSignal: tc.image}})
			if tc.wantErr != "" {
				wantErr(t, err, isInvalid, tc.wantErr)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("signal %d, want %d", got, tc.want)
			}
		})
	}
}

// TestGenerateFull is a kubelet-like request with most features at once, checked for
// sanity and JSON round-trip.
func TestGenerateFull(t *testing.T) {
	setHost(t, defaultHost())
	in := baseInput(t)
	in.Image.Config = ocispec.ImageConfig{
		User: "alice", Env: []string{"PATH=/usr/bin:/bin", "LANG=C"}, Entrypoint: []string{"/entry"}, Cmd: []string{"serve"},
		WorkingDir: "/srv", StopSignal: "SIGQUIT", Volumes: map[string]struct{}{"/data": {}},
	}
	in.Config.Args = []string{"--port", "80"}
	in.Config.Envs = []*runtime.KeyValue{{Key: "LANG", Value: []byte("C.UTF-8")}}
	in.Config.Annotations = map[string]string{"io.kubernetes.container.hash": "abc"}
	in.Config.Mounts = []*runtime.Mount{{ContainerPath: "/var/run/secrets/kubernetes.io/serviceaccount", HostPath: t.TempDir(), Readonly: true}}
	in.Config.Linux.Resources = &runtime.LinuxContainerResources{CpuShares: 2, MemoryLimitInBytes: 64 << 20, OomScoreAdj: 999}
	s := sc(in)
	s.RunAsUser, s.SupplementalGroups = i64(1000), []int64{2000}
	s.Seccomp = &runtime.SecurityProfile{ProfileType: runtime.SecurityProfile_RuntimeDefault}
	s.Capabilities = &runtime.Capability{DropCapabilities: []string{"ALL"}}
	s.NoNewPrivs = true
	in.PodFilesDir, in.ShmPath = t.TempDir(), t.TempDir()

	res := mustGenerate(t, in)
	p := res.Spec.Process
	equal(t, "args", p.Args, []string{"/entry", "--port", "80"})
	equal(t, "env", p.Env, []string{"PATH=/usr/bin:/bin", "HOSTNAME=pod-host", "LANG=C.UTF-8"})
	equal(t, "cwd", p.Cwd, "/srv")
	equal(t, "user", p.User, specs.User{UID: 1000, GID: 1000, AdditionalGids: []uint32{44, 100, 1000, 2000}})
	equal(t, "user info", res.User, UserInfo{1000, 1000, []uint32{44, 100, 1000, 2000}})
	if len(p.Capabilities.Bounding) != 0 || res.Spec.Linux.Seccomp == nil || !p.NoNewPrivileges {
		t.Errorf("security: caps %v seccomp %v nnp %v", p.Capabilities.Bounding, res.Spec.Linux.Seccomp != nil, p.NoNewPrivileges)
	}
	if findMount(res.Spec, "/data") != nil {
		t.Error("image volume mounted: image VOLUMEs stay in the rootfs")
	}
	if len(res.Warnings) != 0 {
		t.Errorf("warnings %q", res.Warnings)
	}
}

func TestMergeResources(t *testing.T) {
	cur := &runtime.LinuxContainerResources{
		CpuPeriod: 100000, CpuQuota: 50000, CpuShares: 512, MemoryLimitInBytes: 64 << 20,
		OomScoreAdj: 500, CpusetCpus: "0", HugepageLimits: []*runtime.HugepageLimit{{PageSize: "2MB", Limit: 4 << 20}},
		Unified: map[string]string{"memory.high": "50000000"},
	}
	for _, tc := range []struct {
		name string
		cur  *runtime.LinuxContainerResources
		upd  *runtime.LinuxContainerResources
		want *runtime.LinuxContainerResources
	}{
		{"memory only keeps the rest", cur, &runtime.LinuxContainerResources{MemoryLimitInBytes: 128 << 20},
			&runtime.LinuxContainerResources{CpuPeriod: 100000, CpuQuota: 50000, CpuShares: 512, MemoryLimitInBytes: 128 << 20,
				OomScoreAdj: 500, CpusetCpus: "0", HugepageLimits: []*runtime.HugepageLimit{{PageSize: "2MB", Limit: 4 << 20}},
				Unified: map[string]string{"memory.high": "50000000"}}},
		{"cpu fields replace, oom_score_adj is the process's", cur, &runtime.LinuxContainerResources{CpuQuota: -1, CpuShares: 2, OomScoreAdj: 1000, CpusetMems: "0"},
			&runtime.LinuxContainerResources{CpuPeriod: 100000, CpuQuota: -1, CpuShares: 2, MemoryLimitInBytes: 64 << 20,
				OomScoreAdj: 500, CpusetCpus: "0", CpusetMems: "0", HugepageLimits: []*runtime.HugepageLimit{{PageSize: "2MB", Limit: 4 << 20}},
				Unified: map[string]string{"memory.high": "50000000"}}},
		{"hugepages by size, unified by key", cur, &runtime.LinuxContainerResources{
			HugepageLimits: []*runtime.HugepageLimit{{PageSize: "2MB", Limit: 8 << 20}, {PageSize: "1GB", Limit: 0}},
			Unified:        map[string]string{"memory.high": "1", "pids.max": "10"}},
			&runtime.LinuxContainerResources{CpuPeriod: 100000, CpuQuota: 50000, CpuShares: 512, MemoryLimitInBytes: 64 << 20,
				OomScoreAdj: 500, CpusetCpus: "0", HugepageLimits: []*runtime.HugepageLimit{{PageSize: "2MB", Limit: 8 << 20}, {PageSize: "1GB"}},
				Unified: map[string]string{"memory.high": "1", "pids.max": "10"}}},
		{"a new limit replaces an explicit swap limit",
			&runtime.LinuxContainerResources{MemoryLimitInBytes: 64 << 20, MemorySwapLimitInBytes: 128 << 20},
			&runtime.LinuxContainerResources{MemoryLimitInBytes: 96 << 20},
			&runtime.LinuxContainerResources{MemoryLimitInBytes: 96 << 20, MemorySwapLimitInBytes: 96 << 20}},
		{"nothing before", nil, &runtime.LinuxContainerResources{CpuShares: 256},
			&runtime.LinuxContainerResources{CpuShares: 256}},
		{"nothing updated", cur, nil, cur},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var before *runtime.LinuxContainerResources
			if tc.cur != nil {
				before = proto.Clone(tc.cur).(*runtime.LinuxContainerResources)
			}
			got := MergeResources(tc.cur, tc.upd)
			if !proto.Equal(got, tc.want) {
				t.Errorf("got %v\nwant %v", got, tc.want)
			}
			if tc.cur != nil && !proto.Equal(tc.cur, before) {
				t.Errorf("cur was changed: %v", tc.cur)
			}
		})
	}
}
