package cri

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func ctr(id string, labelBytes int) *runtime.Container {
	return &runtime.Container{Id: id, Labels: map[string]string{"big": strings.Repeat("x", labelBytes)}}
}

func TestSendChunks(t *testing.T) {
	tests := []struct {
		name     string
		items    int
		label    int
		maxBytes int
		wantMsgs int
	}{
		{name: "empty sends nothing", items: 0, maxBytes: 1 << 20, wantMsgs: 0},
		{name: "all fit in one", items: 10, label: 10, maxBytes: 1 << 20, wantMsgs: 1},
		// Each item is ~1 KiB encoded, so 4 fit under 4.5 KiB.
		{name: "split by size", items: 10, label: 1000, maxBytes: 4500, wantMsgs: 3},
		{name: "oversized item goes alone", items: 3, label: 10000, maxBytes: 4500, wantMsgs: 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var items []*runtime.Container
			for i := range tc.items {
				items = append(items, ctr(fmt.Sprint(i), tc.label))
			}
			var got []string
			msgs := 0
			err := sendChunks(context.Background(), items, tc.maxBytes, func(chunk []*runtime.Container) error {
				msgs++
				if len(chunk) == 0 {
					t.Error("empty chunk sent")
				}
				size := proto.Size(&runtime.StreamContainersResponse{Containers: chunk})
				if len(chunk) > 1 && size > tc.maxBytes {
					t.Errorf("chunk of %d items is %d bytes, over %d", len(chunk), size, tc.maxBytes)
				}
				for _, c := range chunk {
					got = append(got, c.Id)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if msgs != tc.wantMsgs {
				t.Errorf("%d messages, want %d", msgs, tc.wantMsgs)
			}
			// Every item exactly once, in order.
			if len(got) != tc.items {
				t.Fatalf("%d items sent, want %d", len(got), tc.items)
			}
			for i, id := range got {
				if id != fmt.Sprint(i) {
					t.Fatalf("item %d is %s", i, id)
				}
			}
		})
	}
}

func TestSendChunksErrors(t *testing.T) {
	items := []*runtime.Container{ctr("a", 100), ctr("b", 100)}
	boom := errors.New("boom")
	err := sendChunks(context.Background(), items, 150, func([]*runtime.Container) error { return boom })
	if !errors.Is(err, boom) {
		t.Fatalf("send error not returned: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err = sendChunks(ctx, items, 1<<20, func([]*runtime.Container) error { return nil })
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled context: %v", err)
	}
}
