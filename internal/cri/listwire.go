package cri

import (
	"google.golang.org/protobuf/proto"
)

// A list entry comes in two forms. The entry is the message itself, which filters,
// sorting and in-process callers read. Its wire form is an empty message of the same
// type whose unknown fields hold the entry's encoding: proto.Marshal writes unknown
// fields verbatim, so a response of wire forms puts exactly the entry's bytes on the
// wire, without walking its label and annotation maps again. Kubelet lists every pod
// and container every second (and its PLEG relists them), and encoding those maps was
// a third of a list's CPU (server marshal against client unmarshal, 200 containers).
// Both forms are built once per state and shared by concurrent responses: neither may
// be modified.
type listed[T proto.Message] struct {
	entry, wire T
}

// newListed returns entry with its wire form, built with blank (a new empty T).
func newListed[T proto.Message](entry T, blank T) listed[T] {
	b, err := proto.MarshalOptions{}.Marshal(entry)
	if err != nil {
		// Cannot happen for the CRI's messages (no required fields, valid UTF-8 from
		// validated requests); the entry itself is then still correct to send.
		return listed[T]{entry: entry, wire: entry}
	}
	blank.ProtoReflect().SetUnknown(b)
	return listed[T]{entry: entry, wire: blank}
}

// entriesOf returns the entries of l, for in-process callers.
func entriesOf[T proto.Message](l []listed[T]) []T {
	out := make([]T, len(l))
	for i, e := range l {
		out[i] = e.entry
	}
	return out
}

// wiresOf returns the wire forms of l, for a response.
func wiresOf[T proto.Message](l []listed[T]) []T {
	out := make([]T, len(l))
	for i, e := range l {
		out[i] = e.wire
	}
	return out
}
