package cri

import (
	"crypto/sha256"
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func BenchmarkListContainers200(b *testing.B) {
	h := func(s string) string { return fmt.Sprintf("%x", sha256.Sum256([]byte(s))) }
	s := &Service{containers: map[string]*container{}}
	for i := range 200 {
		id := h(fmt.Sprint("c", i))
		s.containers[id] = &container{
			rec:    containerRecord{ID: id, PodID: h(fmt.Sprint("p", i/2)), ImageID: "sha256:" + h("img"), ImageRef: "127.0.0.1:40000/busybox@sha256:" + h("img"), State: stateRunning, CreatedAt: time.Now().UnixNano()},
			config: &runtime.ContainerConfig{Metadata: &runtime.ContainerMetadata{Name: "sleep"}, Image: &runtime.ImageSpec{Image: "127.0.0.1:40000/busybox:bench"}},
		}
	}
	b.Run("handler", func(b *testing.B) {
		for b.Loop() {
			s.listContainers(nil)
		}
	})
	b.Run("handler+marshal", func(b *testing.B) {
		for b.Loop() {
			_, _ = proto.Marshal(&runtime.ListContainersResponse{Containers: s.listContainers(nil)})
		}
	})
}

// The cached list entry follows the container's state, and filters see the new state.
func TestListEntryFollowsState(t *testing.T) {
	c := &container{
		rec:    containerRecord{ID: "c1", PodID: "p1", ImageID: "sha256:1", State: stateCreated},
		config: &runtime.ContainerConfig{Metadata: &runtime.ContainerMetadata{Name: "a"}, Labels: map[string]string{"app": "x"}},
	}
	s := &Service{containers: map[string]*container{"c1": c}}
	exited := &runtime.ContainerFilter{State: &runtime.ContainerStateValue{State: runtime.ContainerState_CONTAINER_EXITED}}
	steps := []struct {
		state   string
		want    runtime.ContainerState
		inExits int
	}{
		{stateCreated, runtime.ContainerState_CONTAINER_CREATED, 0},
		{stateRunning, runtime.ContainerState_CONTAINER_RUNNING, 0},
		{stateExited, runtime.ContainerState_CONTAINER_EXITED, 1},
	}
	for _, st := range steps {
		c.mu.Lock()
		c.rec.State = st.state
		c.mu.Unlock()
		all := s.listContainers(nil)
		if len(all) != 1 || all[0].State != st.want || all[0].Labels["app"] != "x" || all[0].ImageId != "sha256:1" {
			t.Fatalf("state %s: list %v", st.state, all)
		}
		if got := len(s.listContainers(exited)); got != st.inExits {
			t.Errorf("state %s: %d in the exited filter, want %d", st.state, got, st.inExits)
		}
	}
}
