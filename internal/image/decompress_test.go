package image

import (
	"bytes"
	"errors"
	"io"
	"testing"
	"testing/iotest"

	"github.com/containerd/errdefs"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
)

func TestDecompress(t *testing.T) {
	payload := bytes.Repeat([]byte("crisp layer "), 1000)
	var gz, zs bytes.Buffer
	gw := gzip.NewWriter(&gz)
	gw.Write(payload)
	gw.Close()
	zw, _ := zstd.NewWriter(&zs)
	zw.Write(payload)
	zw.Close()
	cases := map[string][]byte{"gzip": gz.Bytes(), "zstd": zs.Bytes(), "plain": payload, "empty": nil}
	for name, in := range cases {
		t.Run(name, func(t *testing.T) {
			r, err := decompress(bytes.NewReader(in))
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			got, err := io.ReadAll(r)
			if err != nil {
				t.Fatal(err)
			}
			want := payload
			if name == "empty" {
				want = nil
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("got %d bytes, want %d", len(got), len(want))
			}
		})
	}
	// Bad compressed data is the image's (InvalidArgument); a failing read of the blob
	// is not, even when the decoder sees it as the data ending early.
	diskErr := errors.New("input/output error")
	for _, tc := range []struct {
		name    string
		r       io.Reader
		invalid bool
	}{
		{"corrupt gzip header", bytes.NewReader([]byte{0x1f, 0x8b, 0, 0}), true},
		{"truncated gzip", bytes.NewReader(gz.Bytes()[:gz.Len()/2]), true},
		{"truncated zstd", bytes.NewReader(zs.Bytes()[:zs.Len()/2]), true},
		{"gzip blob read fails", io.MultiReader(bytes.NewReader(gz.Bytes()[:gz.Len()/2]), iotest.ErrReader(diskErr)), false},
		{"zstd blob read fails", io.MultiReader(bytes.NewReader(zs.Bytes()[:zs.Len()/2]), iotest.ErrReader(diskErr)), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := decompress(tc.r)
			if err == nil {
				_, err = io.ReadAll(r)
			}
			if err == nil {
				t.Fatal("decoded without error")
			}
			if errdefs.IsInvalidArgument(err) != tc.invalid || !tc.invalid && !errors.Is(err, diskErr) {
				t.Errorf("error %v: InvalidArgument %v, want %v", err, errdefs.IsInvalidArgument(err), tc.invalid)
			}
		})
	}
}
