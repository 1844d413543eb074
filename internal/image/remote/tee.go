package remote

import (
	"errors"
	"io"
	"sync"
)

// errConsumerDone is what the download's writes into the pipe get once the consumer
// has returned: the rest of the blob is only stored.
var errConsumerDone = errors.New("the layer's consumer stopped reading")

// teeConsumer feeds one blob download to a consumer running in a goroutine of its own,
// so that storing (and hashing) the compressed bytes and consuming them (decompressing,
// unpacking) overlap: the download is one read of the connection. The consumer starts
// only if this fetch downloads the blob itself.
type teeConsumer struct {
	consume func(io.Reader) error

	mu       sync.Mutex
	started  bool
	finished bool
	pw       *io.PipeWriter
	done     chan struct{}
	err      error // consume's result, set before done is closed
}

func startConsumer(consume func(io.Reader) error) *teeConsumer {
	return &teeConsumer{consume: consume}
}

// reader wraps the download's body: what is read from it is written to the consumer
// too. Called by the download, at most once per fetch that owns it.
func (t *teeConsumer) reader(body io.Reader) io.Reader {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.started || t.finished {
		// A second download (a retry) or one that outlives the fetch: the consumer
		// saw, or will see, nothing of it; it reads the stored blob instead.
		return body
	}
	pr, pw := io.Pipe()
	t.started, t.pw, t.done = true, pw, make(chan struct{})
	go func() {
		defer close(t.done)
		t.err = t.consume(pr)
		// Unblock the download if the consumer stopped early.
		pr.CloseWithError(errConsumerDone)
	}()
	return &teeReader{r: body, w: pw}
}

// finish ends the stream with the download's result (nil: the blob is stored and
// verified, so the consumer reads io.EOF) and waits for the consumer. streamed tells
// whether the consumer ran.
func (t *teeConsumer) finish(downloadErr error) (streamed bool, err error) {
	t.mu.Lock()
	t.finished = true
	started := t.started
	if started {
		if downloadErr != nil {
			t.pw.CloseWithError(downloadErr)
		} else {
			_ = t.pw.Close()
		}
	}
	t.mu.Unlock()
	if !started {
		return false, nil
	}
	<-t.done
	return true, t.err
}

// teeReader is io.TeeReader that keeps reading when the writer fails: the download
// must go on for the content store (and other pulls waiting for the blob) when the
// consumer has stopped.
type teeReader struct {
	r    io.Reader
	w    io.Writer
	dead bool
}

func (t *teeReader) Read(p []byte) (int, error) {
	n, err := t.r.Read(p)
	if n > 0 && !t.dead {
		if _, werr := t.w.Write(p[:n]); werr != nil {
			t.dead = true
		}
	}
	return n, err
}
