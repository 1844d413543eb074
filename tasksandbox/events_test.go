package tasksandbox

import (
	"context"
	"io"
	"log/slog"
	"testing"

	apievents "github.com/containerd/containerd/api/events"
	eventsapi "github.com/containerd/containerd/api/services/ttrpc/events/v1"
	"github.com/containerd/containerd/api/types"
	"google.golang.org/protobuf/types/known/anypb"
)

// A TaskOOM event a shim forwards marks its container OOM-killed until it is
// forgotten; other events and other containers are not marked.
func TestEventSinkTaskOOM(t *testing.T) {
	s := &Sandboxer{}
	sink := eventSink{log: slog.New(slog.NewTextHandler(io.Discard, nil)), oom: &s.oom}
	forward := func(topic string, ev *apievents.TaskOOM) {
		t.Helper()
		a, err := anypb.New(ev)
		if err != nil {
			t.Fatal(err)
		}
		env := &types.Envelope{Topic: topic, Namespace: "k8s.io", Event: a}
		if _, err := sink.Forward(context.Background(), &eventsapi.ForwardRequest{Envelope: env}); err != nil {
			t.Fatal(err)
		}
	}
	forward("/tasks/exit", &apievents.TaskOOM{ContainerID: "other"})
	forward(taskOOMTopic, &apievents.TaskOOM{ContainerID: "hog"})
	if !s.OOMReported("hog") || s.OOMReported("other") || s.OOMReported("") {
		t.Errorf("after a TaskOOM for hog: hog %v, other %v", s.OOMReported("hog"), s.OOMReported("other"))
	}
	s.ForgetOOM("hog")
	if s.OOMReported("hog") {
		t.Error("hog still marked after ForgetOOM")
	}
}
