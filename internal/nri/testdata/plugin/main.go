// Command plugin is a pre-registered NRI plugin for nri's tests: started by the
// runtime from its plugin_path, it sets PREREGISTERED=<its config> in every container;
// with the config "crash" it exits at its first CreateContainer instead.
package main

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
)

type plugin struct{ value string }

func (p *plugin) Configure(_ context.Context, config, _, _ string) (api.EventMask, error) {
	if v := strings.TrimSpace(config); v != "" {
		p.value = v
	}
	return 0, nil
}

func (p *plugin) CreateContainer(context.Context, *api.PodSandbox, *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	if p.value == "crash" {
		os.Exit(3)
	}
	adj := &api.ContainerAdjustment{}
	adj.AddEnv("PREREGISTERED", p.value)
	return adj, nil, nil
}

func main() {
	p := &plugin{value: "no-config"}
	s, err := stub.New(p)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if err := s.Run(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
