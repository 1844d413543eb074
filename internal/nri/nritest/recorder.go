// Package nritest has what crisp's tests need to play an NRI plugin (written with
// the library's pkg/stub): a recorder of the lifecycle events a plugin sees.
package nritest

import (
	"context"
	"slices"
	"sync"

	"github.com/containerd/nri/pkg/api"
)

// Recorder is a set of pkg/stub event handlers that record each event as
// "<Event> <key>", the key being the pod's or container's name, or its id with ByID.
// Embed it in a plugin and override the handlers the plugin does more in; the stub
// subscribes the plugin to every event Recorder handles.
type Recorder struct {
	// ByID keys records by id instead of name.
	ByID bool

	mu     sync.Mutex
	events []string
}

// Record adds ev to the record.
func (r *Recorder) Record(ev string) {
	r.mu.Lock()
	r.events = append(r.events, ev)
	r.mu.Unlock()
}

// Events is what was recorded so far.
func (r *Recorder) Events() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events)
}

func (r *Recorder) pod(ev string, p *api.PodSandbox) {
	if r.ByID {
		r.Record(ev + " " + p.GetId())
	} else {
		r.Record(ev + " " + p.GetName())
	}
}

func (r *Recorder) ctr(ev string, c *api.Container) {
	if r.ByID {
		r.Record(ev + " " + c.GetId())
	} else {
		r.Record(ev + " " + c.GetName())
	}
}

// RunPodSandbox records the event.
func (r *Recorder) RunPodSandbox(_ context.Context, p *api.PodSandbox) error {
	r.pod("RunPodSandbox", p)
	return nil
}

// PostUpdatePodSandbox records the event.
func (r *Recorder) PostUpdatePodSandbox(_ context.Context, p *api.PodSandbox) error {
	r.pod("PostUpdatePodSandbox", p)
	return nil
}

// StopPodSandbox records the event.
func (r *Recorder) StopPodSandbox(_ context.Context, p *api.PodSandbox) error {
	r.pod("StopPodSandbox", p)
	return nil
}

// RemovePodSandbox records the event.
func (r *Recorder) RemovePodSandbox(_ context.Context, p *api.PodSandbox) error {
	r.pod("RemovePodSandbox", p)
	return nil
}

// PostCreateContainer records the event.
func (r *Recorder) PostCreateContainer(_ context.Context, _ *api.PodSandbox, c *api.Container) error {
	r.ctr("PostCreateContainer", c)
	return nil
}

// StartContainer records the event.
func (r *Recorder) StartContainer(_ context.Context, _ *api.PodSandbox, c *api.Container) error {
	r.ctr("StartContainer", c)
	return nil
}

// PostStartContainer records the event.
func (r *Recorder) PostStartContainer(_ context.Context, _ *api.PodSandbox, c *api.Container) error {
	r.ctr("PostStartContainer", c)
	return nil
}

// UpdateContainer records the event and asks for no update.
func (r *Recorder) UpdateContainer(_ context.Context, _ *api.PodSandbox, c *api.Container, _ *api.LinuxResources) ([]*api.ContainerUpdate, error) {
	r.ctr("UpdateContainer", c)
	return nil, nil
}

// PostUpdateContainer records the event.
func (r *Recorder) PostUpdateContainer(_ context.Context, _ *api.PodSandbox, c *api.Container) error {
	r.ctr("PostUpdateContainer", c)
	return nil
}

// StopContainer records the event and asks for no update.
func (r *Recorder) StopContainer(_ context.Context, _ *api.PodSandbox, c *api.Container) ([]*api.ContainerUpdate, error) {
	r.ctr("StopContainer", c)
	return nil, nil
}

// RemoveContainer records the event.
func (r *Recorder) RemoveContainer(_ context.Context, _ *api.PodSandbox, c *api.Container) error {
	r.ctr("RemoveContainer", c)
	return nil
}
