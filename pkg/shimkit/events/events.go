// Package events publishes containerd's task events (/tasks/create, /tasks/exit, …)
// from the shim to its caller's ttrpc Events service, as containerd's own shims do, so
// that containerd learns of exits without polling.
//
// The messages are encoded by field number (containerd/api v1.12 events/task.proto,
// types/event.proto, services/ttrpc/events/v1/events.proto) rather than with
// containerd's generated packages: those link gRPC into every per-pod shim, and
// generated copies would cost package-init memory in every shim for a handful of
// flat messages (see api/containerd/doc.go).
package events

import (
	"time"

	"google.golang.org/protobuf/encoding/protowire"
)

// Topics as containerd names them (core/runtime/events.go).
const (
	TopicCreate       = "/tasks/create"
	TopicStart        = "/tasks/start"
	TopicOOM          = "/tasks/oom"
	TopicExit         = "/tasks/exit"
	TopicDelete       = "/tasks/delete"
	TopicExecAdded    = "/tasks/exec-added"
	TopicExecStarted  = "/tasks/exec-started"
	TopicPaused       = "/tasks/paused"
	TopicResumed      = "/tasks/resumed"
	TopicCheckpointed = "/tasks/checkpointed"
)

// Event is one task event: its topic, the type URL containerd's typeurl gives it (the
// bare proto name) and its protobuf encoding.
type Event interface {
	Topic() string
	TypeURL() string
	AppendProto(b []byte) []byte
}

// Mount is a containerd.types.Mount of a task's rootfs.
type Mount struct {
	Type, Source, Target string
	Options              []string
}

// TaskCreate is containerd.events.TaskCreate.
type TaskCreate struct {
	ContainerID, Bundle   string
	Rootfs                []Mount
	Stdin, Stdout, Stderr string
	Terminal              bool
	Checkpoint            string
	Pid                   uint32
}

// TaskStart is containerd.events.TaskStart.
type TaskStart struct {
	ContainerID string
	Pid         uint32
}

// TaskDelete is containerd.events.TaskDelete.
type TaskDelete struct {
	ContainerID string
	Pid         uint32
	ExitStatus  uint32
	ExitedAt    time.Time
	ID          string
}

// TaskExit is containerd.events.TaskExit; ID is the exec id, or the container id for
// the container's init process.
type TaskExit struct {
	ContainerID, ID string
	Pid             uint32
	ExitStatus      uint32
	ExitedAt        time.Time
}

// TaskOOM is containerd.events.TaskOOM.
type TaskOOM struct{ ContainerID string }

// TaskExecAdded is containerd.events.TaskExecAdded.
type TaskExecAdded struct{ ContainerID, ExecID string }

// TaskExecStarted is containerd.events.TaskExecStarted.
type TaskExecStarted struct {
	ContainerID, ExecID string
	Pid                 uint32
}

// TaskPaused is containerd.events.TaskPaused.
type TaskPaused struct{ ContainerID string }

// TaskResumed is containerd.events.TaskResumed.
type TaskResumed struct{ ContainerID string }

// TaskCheckpointed is containerd.events.TaskCheckpointed; Checkpoint is where the
// images went.
type TaskCheckpointed struct{ ContainerID, Checkpoint string }

// Topic is the topic TaskCreate is published on.
func (TaskCreate) Topic() string { return TopicCreate }

// Topic is the topic TaskStart is published on.
func (TaskStart) Topic() string { return TopicStart }

// Topic is the topic TaskDelete is published on.
func (TaskDelete) Topic() string { return TopicDelete }

// Topic is the topic TaskExit is published on.
func (TaskExit) Topic() string { return TopicExit }

// Topic is the topic TaskOOM is published on.
func (TaskOOM) Topic() string { return TopicOOM }

// Topic is the topic TaskExecAdded is published on.
func (TaskExecAdded) Topic() string { return TopicExecAdded }

// Topic is the topic TaskExecStarted is published on.
func (TaskExecStarted) Topic() string { return TopicExecStarted }

// Topic is the topic TaskPaused is published on.
func (TaskPaused) Topic() string { return TopicPaused }

// Topic is the topic TaskResumed is published on.
func (TaskResumed) Topic() string { return TopicResumed }

// Topic is the topic TaskCheckpointed is published on.
func (TaskCheckpointed) Topic() string { return TopicCheckpointed }

// TypeURL is the type URL of TaskCreate in the event envelope.
func (TaskCreate) TypeURL() string { return "containerd.events.TaskCreate" }

// TypeURL is the type URL of TaskStart in the event envelope.
func (TaskStart) TypeURL() string { return "containerd.events.TaskStart" }

// TypeURL is the type URL of TaskDelete in the event envelope.
func (TaskDelete) TypeURL() string { return "containerd.events.TaskDelete" }

// TypeURL is the type URL of TaskExit in the event envelope.
func (TaskExit) TypeURL() string { return "containerd.events.TaskExit" }

// TypeURL is the type URL of TaskOOM in the event envelope.
func (TaskOOM) TypeURL() string { return "containerd.events.TaskOOM" }

// TypeURL is the type URL of TaskExecAdded in the event envelope.
func (TaskExecAdded) TypeURL() string { return "containerd.events.TaskExecAdded" }

// TypeURL is the type URL of TaskExecStarted in the event envelope.
func (TaskExecStarted) TypeURL() string { return "containerd.events.TaskExecStarted" }

// TypeURL is the type URL of TaskPaused in the event envelope.
func (TaskPaused) TypeURL() string { return "containerd.events.TaskPaused" }

// TypeURL is the type URL of TaskResumed in the event envelope.
func (TaskResumed) TypeURL() string { return "containerd.events.TaskResumed" }

// TypeURL is the type URL of TaskCheckpointed in the event envelope.
func (TaskCheckpointed) TypeURL() string { return "containerd.events.TaskCheckpointed" }

// AppendProto implements Event.
func (e TaskCreate) AppendProto(b []byte) []byte {
	b = appendString(b, 1, e.ContainerID)
	b = appendString(b, 2, e.Bundle)
	for _, m := range e.Rootfs {
		var mb []byte
		mb = appendString(mb, 1, m.Type)
		mb = appendString(mb, 2, m.Source)
		mb = appendString(mb, 3, m.Target)
		for _, o := range m.Options {
			mb = protowire.AppendTag(mb, 4, protowire.BytesType)
			mb = protowire.AppendString(mb, o)
		}
		b = appendMessage(b, 3, mb)
	}
	var io []byte
	io = appendString(io, 1, e.Stdin)
	io = appendString(io, 2, e.Stdout)
	io = appendString(io, 3, e.Stderr)
	if e.Terminal {
		io = appendVarint(io, 4, 1)
	}
	b = appendMessage(b, 4, io)
	b = appendString(b, 5, e.Checkpoint)
	return appendVarint(b, 6, uint64(e.Pid))
}

// AppendProto implements Event.
func (e TaskStart) AppendProto(b []byte) []byte {
	b = appendString(b, 1, e.ContainerID)
	return appendVarint(b, 2, uint64(e.Pid))
}

// AppendProto implements Event.
func (e TaskDelete) AppendProto(b []byte) []byte {
	b = appendString(b, 1, e.ContainerID)
	b = appendVarint(b, 2, uint64(e.Pid))
	b = appendVarint(b, 3, uint64(e.ExitStatus))
	b = appendTimestamp(b, 4, e.ExitedAt)
	return appendString(b, 5, e.ID)
}

// AppendProto implements Event.
func (e TaskExit) AppendProto(b []byte) []byte {
	b = appendString(b, 1, e.ContainerID)
	b = appendString(b, 2, e.ID)
	b = appendVarint(b, 3, uint64(e.Pid))
	b = appendVarint(b, 4, uint64(e.ExitStatus))
	return appendTimestamp(b, 5, e.ExitedAt)
}

// AppendProto implements Event.
func (e TaskOOM) AppendProto(b []byte) []byte { return appendString(b, 1, e.ContainerID) }

// AppendProto encodes containerd.events.TaskPaused.
func (e TaskPaused) AppendProto(b []byte) []byte { return appendString(b, 1, e.ContainerID) }

// AppendProto encodes containerd.events.TaskResumed.
func (e TaskResumed) AppendProto(b []byte) []byte { return appendString(b, 1, e.ContainerID) }

// AppendProto encodes containerd.events.TaskCheckpointed.
func (e TaskCheckpointed) AppendProto(b []byte) []byte {
	return appendString(appendString(b, 1, e.ContainerID), 2, e.Checkpoint)
}

// AppendProto implements Event.
func (e TaskExecAdded) AppendProto(b []byte) []byte {
	b = appendString(b, 1, e.ContainerID)
	return appendString(b, 2, e.ExecID)
}

// AppendProto implements Event.
func (e TaskExecStarted) AppendProto(b []byte) []byte {
	b = appendString(b, 1, e.ContainerID)
	b = appendString(b, 2, e.ExecID)
	return appendVarint(b, 3, uint64(e.Pid))
}

// forwardRequest encodes containerd.services.events.ttrpc.v1.ForwardRequest{envelope:
// containerd.types.Envelope{timestamp, namespace, topic, event: Any}}.
func forwardRequest(at time.Time, namespace string, e Event) []byte {
	var anyb []byte
	anyb = appendString(anyb, 1, e.TypeURL())
	anyb = appendMessage(anyb, 2, e.AppendProto(nil))
	var env []byte
	env = appendTimestamp(env, 1, at)
	env = appendString(env, 2, namespace)
	env = appendString(env, 3, e.Topic())
	env = appendMessage(env, 4, anyb)
	return appendMessage(nil, 1, env)
}

// The helpers leave out proto3 defaults (empty strings, zeros), as proto.Marshal does.

func appendString(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, s)
}

func appendVarint(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}

// appendMessage writes a message field; unlike a scalar it is present even when empty.
func appendMessage(b []byte, num protowire.Number, m []byte) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendBytes(b, m)
}

// appendTimestamp writes a google.protobuf.Timestamp; a zero time is left out, as a
// nil timestamp would be.
func appendTimestamp(b []byte, num protowire.Number, t time.Time) []byte {
	if t.IsZero() {
		return b
	}
	var ts []byte
	ts = appendVarint(ts, 1, uint64(t.Unix()))
	ts = appendVarint(ts, 2, uint64(int64(t.Nanosecond())))
	return appendMessage(b, num, ts)
}
