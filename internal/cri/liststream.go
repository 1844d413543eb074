package cri

import (
	"context"
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// streamChunkBytes bounds the encoded size of the items in one message of a Stream*
// list RPC. Kubelet refuses messages over 16 MiB; a quarter of that leaves room for
// framing and keeps each message's buffer small on both ends, while still carrying
// thousands of ordinary items per message.
const streamChunkBytes = 4 << 20

// StreamPodSandboxes is ListPodSandbox (same filter, same items) in messages of at
// most streamChunkBytes each, for nodes whose list exceeds the gRPC message limit
// (KEP-5825).
func (s *Service) StreamPodSandboxes(req *runtime.StreamPodSandboxesRequest, stream runtime.RuntimeService_StreamPodSandboxesServer) error {
	items := wiresOf(s.listPodSandboxes(req.GetFilter()))
	return toStatus(sendChunks(stream.Context(), items, streamChunkBytes, func(chunk []*runtime.PodSandbox) error {
		return stream.Send(&runtime.StreamPodSandboxesResponse{PodSandboxes: chunk})
	}))
}

// StreamContainers is ListContainers in messages of at most streamChunkBytes each.
func (s *Service) StreamContainers(req *runtime.StreamContainersRequest, stream runtime.RuntimeService_StreamContainersServer) error {
	items := wiresOf(s.listContainers(req.GetFilter()))
	return toStatus(sendChunks(stream.Context(), items, streamChunkBytes, func(chunk []*runtime.Container) error {
		return stream.Send(&runtime.StreamContainersResponse{Containers: chunk})
	}))
}

// StreamImages is ListImages in messages of at most streamChunkBytes each.
func (s *Service) StreamImages(req *runtime.StreamImagesRequest, stream runtime.ImageService_StreamImagesServer) error {
	items, err := s.listImages(req.GetFilter())
	if err != nil {
		return toStatus(err)
	}
	return toStatus(sendChunks(stream.Context(), items, streamChunkBytes, func(chunk []*runtime.Image) error {
		return stream.Send(&runtime.StreamImagesResponse{Images: chunk})
	}))
}

// sendChunks sends items in order, each exactly once, in chunks whose items encode
// to at most maxBytes (a single larger item goes alone: it cannot be split). An empty
// list sends nothing: the KEP's messages hold at least one item, and the stream's
// EOF tells the client the list is complete.
func sendChunks[T proto.Message](ctx context.Context, items []T, maxBytes int, send func([]T) error) error {
	start, size := 0, 0
	flush := func(end int) error {
		if end == start {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("list stream cancelled after %d of %d items: %w", start, len(items), err)
		}
		if err := send(items[start:end]); err != nil {
			return fmt.Errorf("send items %d-%d of %d: %w", start, end-1, len(items), err)
		}
		start, size = end, 0
		return nil
	}
	for i, it := range items {
		// Each item is an entry of the response's repeated field 1: tag, length, bytes.
		n := protowire.SizeTag(1) + protowire.SizeBytes(proto.Size(it))
		if size+n > maxBytes && i > start {
			if err := flush(i); err != nil {
				return err
			}
		}
		size += n
	}
	return flush(len(items))
}
