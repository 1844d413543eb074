package image

import (
	"bytes"
	"io"
	"testing"

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
	if r, err := decompress(bytes.NewReader([]byte{0x1f, 0x8b, 0, 0})); err == nil {
		if _, err := io.ReadAll(r); err == nil {
			t.Fatal("corrupt gzip decoded without error")
		}
	}
}
