package spec

import (
	"testing"

	"github.com/opencontainers/runtime-spec/specs-go"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

// BenchmarkCDIInject measures what CDI adds to a CreateContainer that requests two
// devices: refresh-on-use (crisp's choice) against the library's auto-refresh mode.
func BenchmarkCDIInject(b *testing.B) {
	dir := writeCDIDir(b, map[string]string{"vendor.json": vendorSpec})
	cfg := &runtime.ContainerConfig{CDIDevices: []*runtime.CDIDevice{{Name: "vendor.com/dev=null1"}, {Name: "vendor.com/dev=zero1"}}}
	auto, _ := cdi.NewCache(cdi.WithSpecDirs(dir))
	for _, c := range []struct {
		name string
		cdi  *CDI
	}{
		{"refresh-on-use", NewCDI([]string{dir})},
		{"auto-refresh", &CDI{cache: auto, dirs: []string{dir}}},
	} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				if err := c.cdi.injectCDI(&specs.Spec{Process: &specs.Process{}, Linux: &specs.Linux{Resources: &specs.LinuxResources{}}}, cfg); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
