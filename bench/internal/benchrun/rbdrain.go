// SPDX-License-Identifier: Apache-2.0

package benchrun

import (
	"fmt"
	"time"

	"github.com/aquasecurity/libbpfgo"
	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"
	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/bench/internal/cref"
	"github.com/perfbuf/perfbuf/internal/bpfrun"
	"golang.org/x/sys/unix"
)

// The BPF ring buffer measurements (BPF_MAP_TYPE_RINGBUF) read one ring
// that every CPU writes, filled by bench/perfbench/bpf/rbbench.bpf.c: the
// perf emitter's program and counts (internal/bpfrun drives both) over a
// 4 MiB ring buffer. The kernel's own comparison of ring buffer consumers,
// tools/testing/selftests/bpf/benchs/bench_ringbufs.c, is the model:
// libbpf's ring_buffer from C (rb-libbpf) beside other consumers, on the
// same producers.
//
// Besides perfbuf's forms and the C reference, two Go libraries read the
// same rings: cilium/ebpf's ringbuf.Reader (ReadInto, a copy into a reused
// Record) and libbpfgo's RingBuffer (libbpf's ring_buffer__poll on a
// goroutine of its own, each record copied into a new []byte and sent on a
// channel).

// The modes only ring buffers have.
const (
	ModeReaderConsume = "reader-consume" // Reader.Consume, zero-copy, no wait
	ModeCilium        = "cilium"         // cilium/ebpf ringbuf.Reader.ReadInto, perf.Reader.ReadInto over a perf event array
	ModeLibbpfgo      = "libbpfgo"       // libbpfgo RingBuffer: ring_buffer__poll, a channel
)

// RBDrainModes are the modes RBDrainCompare measures, the reference
// (ModeC: ring_buffer__consume with a C callback) first.
var RBDrainModes = []string{ModeC, ModeCallback, ModeRawZeroCopy, ModeReader, ModeReaderBatch, ModeReaderEach, ModeReaderBatches, ModeReaderConsume, ModeOrdered, ModeOrderedBatch, ModeOrderedEach, ModeOrderedBatches, ModeCilium, ModeLibbpfgo}

const (
	// RBBytes is the ring buffer's size (rbbench.bpf.c's max_entries).
	RBBytes = 4 << 20
	// RBFillPercent is how full a drain round fills it.
	RBFillPercent = 90
)

// RBRecordSize is the ring space an n-byte sample takes in a BPF ring
// buffer: the 8-byte struct bpf_ringbuf_hdr and the data, padded to 8 bytes.
func RBRecordSize(n int) int { return 8 + (n+7)&^7 }

// RBPerRound is how many size-byte samples one ring buffer drain round
// fills and drains: RBFillPercent of the ring.
func RBPerRound(size int) int { return RBBytes / 100 * RBFillPercent / RBRecordSize(size) }

// RBDrainCompare is DrainCompare over a BPF ring buffer: e is the ring
// buffer emitter (rbbench.bpf.o), each mode reads a copy of it (a ring
// buffer of its own, all open at once), and each round fills FillCPU's
// share of RBPerRound samples, untimed, then drains it, timed, every mode
// in turn. cfg.Pages is not used.
func RBDrainCompare(e *bpfrun.Emitter, cfg DrainConfig, modes []string, timers []Timer) ([]DrainResult, error) {
	if t := e.Events.Type(); t != libbpfgo.MapTypeRingbuf {
		return nil, fmt.Errorf("ring buffer drain: map %s is a %v, not a ring buffer (load rbbench.bpf.o)", e.Events.Name(), t)
	}
	return drainCompare(e, cfg, modes, timers, RBPerRound(max(cfg.Size, 1)), openRBDrainer)
}

// RBDrain measures cfg.Mode alone: RBDrainCompare with one mode.
func RBDrain(e *bpfrun.Emitter, cfg DrainConfig, t Timer) (DrainResult, error) {
	res, err := RBDrainCompare(e, cfg, []string{cfg.Mode}, []Timer{t})
	if err != nil {
		return DrainResult{}, err
	}
	return res[0], nil
}

// openRBDrainer opens cfg.Mode's reader over e's ring buffer.
func openRBDrainer(e *bpfrun.Emitter, cfg DrainConfig) (drainer, error) {
	base := fillOne{e: e, size: cfg.Size, batch: MaxBatch}
	switch cfg.Mode {
	case ModeC:
		r, err := cref.OpenRing(e.Events.FileDescriptor())
		if err != nil {
			return nil, err
		}
		return &rbCDrain{fillOne: base, r: r}, nil
	case ModeCallback:
		d := &callbackDrain{fillOne: base}
		pb, err := perfbuf.New(e.Events, func(_ int, data []byte) { d.total += cref.ReadAll(data) }, nil, perfbuf.Options{})
		if err != nil {
			return nil, err
		}
		d.pb = pb
		return d, nil
	case ModeRawZeroCopy:
		pb, err := perfbuf.NewRaw(e.Events, perfbuf.Options{})
		if err != nil {
			return nil, err
		}
		d := &rawDrain{fillOne: base, pb: pb}
		if d.rb, err = pb.Buffer(0); err != nil {
			pb.Close()
			return nil, err
		}
		d.fn = func(rec *perfbuf.Record) error {
			d.total += cref.ReadAll(rec.Data) + readWrapped(rec)
			return nil
		}
		return d, nil
	case ModeReader, ModeReaderEach, ModeReaderConsume, ModeReaderBatch, ModeReaderBatches:
		r, err := perfbuf.NewReader(e.Events, perfbuf.ReaderOptions{})
		if err != nil {
			return nil, err
		}
		if cfg.Mode == ModeReaderConsume {
			d := &consumeDrain{fillOne: base, r: r}
			d.fn = func(rec *perfbuf.Record) error {
				if rec.Type != perfbuf.RecordSample {
					return notSample(rec.CPU, rec.Type, rec.Lost)
				}
				d.total += cref.ReadAll(rec.Data) + readWrapped(rec)
				return nil
			}
			return d, nil
		}
		return &readerDrain{fillOne: base, r: r, each: cfg.Mode == ModeReaderEach, batches: cfg.Mode == ModeReaderBatches, s: samplesFor(cfg.Mode)}, nil
	case ModeOrdered, ModeOrderedEach, ModeOrderedBatch, ModeOrderedBatches:
		return openRBOrdered(base, cfg)
	case ModeCilium:
		r, err := openCilium(e.Events.FileDescriptor())
		if err != nil {
			return nil, err
		}
		return &ciliumDrain{fillOne: base, r: r}, nil
	case ModeLibbpfgo:
		return openLibbpfgoDrain(base)
	}
	return nil, fmt.Errorf("unknown ring buffer mode %q", cfg.Mode)
}

// rbCDrain: ring_buffer__consume with a C callback.
type rbCDrain struct {
	fillOne
	r *cref.RingReader
}

func (d *rbCDrain) drain(k int) error {
	n, err := d.r.Consume()
	return checkCount(err, n, k)
}

func (d *rbCDrain) sum() uint64 { return d.r.Sum() }
func (d *rbCDrain) close()      { d.r.Close() }

// consumeDrain: Reader.Consume, which delivers what is there, zero-copy,
// without waiting (no Flush needed to end a round).
type consumeDrain struct {
	fillOne
	r     *perfbuf.Reader
	fn    func(*perfbuf.Record) error
	total uint64
}

func (d *consumeDrain) drain(k int) error {
	n, err := d.r.Consume(d.fn)
	return checkCount(err, n, k)
}

func (d *consumeDrain) sum() uint64 { return d.total }
func (d *consumeDrain) close()      { d.r.Close() }

// openCilium opens cilium/ebpf's ringbuf.Reader over the ring buffer
// mapFD (the reader keeps the map open).
func openCilium(mapFD int) (*ciliumReader, error) {
	m, err := ciliumMap(mapFD)
	if err != nil {
		return nil, err
	}
	r, err := ringbuf.NewReader(m)
	if err != nil {
		m.Close()
		return nil, fmt.Errorf("cilium/ebpf ringbuf reader: %w", err)
	}
	return &ciliumReader{m: m, r: r}, nil
}

// ciliumMap is mapFD as cilium/ebpf's map, through a duplicate of the
// descriptor: ebpf.NewMapFromFD takes ownership of the one it is given.
func ciliumMap(mapFD int) (*ebpf.Map, error) {
	fd, err := unix.FcntlInt(uintptr(mapFD), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("dup map fd: %w", err)
	}
	m, err := ebpf.NewMapFromFD(fd)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("cilium/ebpf map: %w", err)
	}
	return m, nil
}

// ciliumReader is cilium/ebpf's reader and the map it reads.
type ciliumReader struct {
	m *ebpf.Map
	r *ringbuf.Reader
}

func (c *ciliumReader) close() {
	c.r.Close()
	c.m.Close()
}

// ciliumDrain: cilium/ebpf's ringbuf.Reader.ReadInto into one reused
// Record, k times a round (it waits in epoll_wait when the ring is empty,
// so a round reads exactly what was filled).
type ciliumDrain struct {
	fillOne
	r     *ciliumReader
	rec   ringbuf.Record
	total uint64
}

func (d *ciliumDrain) drain(k int) error {
	for i := range k {
		if err := d.r.r.ReadInto(&d.rec); err != nil {
			return fmt.Errorf("cilium/ebpf ReadInto after %d of %d: %w", i, k, err)
		}
		d.total += cref.ReadAll(d.rec.RawSample)
	}
	return nil
}

func (d *ciliumDrain) sum() uint64 { return d.total }
func (d *ciliumDrain) close()      { d.r.close() }

// libbpfgoPollMs is the poll timeout of libbpfgo's polling goroutine: how
// long its Stop (in Close) may wait.
const libbpfgoPollMs = 20

// libbpfgoChanCap is the capacity of the channel libbpfgo's RingBuffer
// sends on. Unbuffered, every record is a handoff between two threads
// (the polling goroutine sends from libbpf's callback, on a thread locked
// to it): microseconds a record. A buffer lets it run ahead, as an
// application that keeps up with a ring would have it.
const libbpfgoChanCap = 1024

// libbpfgoDrain: libbpfgo's RingBuffer, as its users read it: Poll starts a
// goroutine that calls ring_buffer__poll in a loop, whose callback copies
// each record into a new []byte and sends it on the channel; a goroutine
// of the application's receives them. Here that goroutine (recv) is not
// locked to a thread, as an application's would not be; a round hands it
// the count to receive and waits for it to finish.
//
// Poll cannot be stopped and started again (Stop closes the channel), so the
// polling goroutine runs for the measurement's whole life, unpinned, and
// would read the ring while it is filled. To keep it from doing so, fill
// sends libbpfgoChanCap nil slices first (untimed), so that the channel is
// full: the polling goroutine takes the round's first record and blocks
// sending it until the timed part receives the nil slices (a receive each,
// 20-30 ns, against the records' hundreds) and then every record of the
// round.
type libbpfgoDrain struct {
	fillOne
	*libbpfgoRing
	req   chan int   // a round's count, to recv
	done  chan error // recv's answer
	total uint64     // recv's, read after a round
}

// libbpfgoRing is libbpfgo's RingBuffer, polling, and its channel.
type libbpfgoRing struct {
	rb *libbpfgo.RingBuffer
	ch chan []byte
}

// openLibbpfgo opens libbpfgo's RingBuffer over e's ring buffer and starts
// its polling goroutine.
func openLibbpfgo(e *bpfrun.Emitter) (*libbpfgoRing, error) {
	ch := make(chan []byte, libbpfgoChanCap)
	rb, err := e.Mod.InitRingBuf(e.Events.Name(), ch)
	if err != nil {
		return nil, fmt.Errorf("libbpfgo ring buffer: %w", err)
	}
	rb.Poll(libbpfgoPollMs)
	return &libbpfgoRing{rb: rb, ch: ch}, nil
}

// close stops the polling goroutine (within libbpfgoPollMs), receiving
// what it sends meanwhile, closes the channel and frees the ring buffer.
func (l *libbpfgoRing) close() { l.rb.Close() }

func openLibbpfgoDrain(base fillOne) (drainer, error) {
	l, err := openLibbpfgo(base.e)
	if err != nil {
		return nil, err
	}
	d := &libbpfgoDrain{fillOne: base, libbpfgoRing: l, req: make(chan int), done: make(chan error)}
	go d.recv()
	return d, nil
}

func (d *libbpfgoDrain) fill(k int) error {
	if n := len(d.ch); n != 0 {
		return fmt.Errorf("libbpfgo: %d records in the channel before a fill", n)
	}
	for range libbpfgoChanCap {
		d.ch <- nil
	}
	return d.fillOne.fill(k)
}

// recv receives the rounds' records on a goroutine of its own, as an
// application would: for each count on req, the nil slices fill put in the
// channel, then that many records, answering on done.
func (d *libbpfgoDrain) recv() {
	for k := range d.req {
		for range libbpfgoChanCap {
			<-d.ch
		}
		var err error
		for i := range k {
			b := <-d.ch
			if b == nil {
				err = fmt.Errorf("libbpfgo: record %d of %d is nil", i, k)
				break
			}
			d.total += cref.ReadAll(b)
		}
		d.done <- err
	}
}

func (d *libbpfgoDrain) drain(k int) error {
	d.req <- k
	return <-d.done
}

func (d *libbpfgoDrain) sum() uint64 { return d.total }

func (d *libbpfgoDrain) close() {
	close(d.req)
	d.libbpfgoRing.close()
}

// openRBOrdered opens the ordered Reader over the one ring buffer, its
// records merged by their sequence number (the emitter's header's first
// word, which grows on FillCPU, the only CPU that fills it) with a key
// window of 1 (rule 2's window is MaxDelay in nanoseconds: 1 ns): rule 2
// releases each record once the next one is read, so that all but a
// round's last record go with the release rules in force, and the last one
// at a later look (rule 3, MaxDelay 1 ns) or at the round's Flush
// (orderedDrain). Over one ring buffer the Reader copies the records it
// holds into its window, and reads a ring it is behind on in place: the
// drain measures both.
func openRBOrdered(f fillOne, cfg DrainConfig) (drainer, error) {
	r, err := perfbuf.NewReader(f.e.Events, perfbuf.ReaderOptions{
		Order: &perfbuf.Order{KeyOffset: 0, MaxDelay: time.Nanosecond},
	})
	if err != nil {
		return nil, err
	}
	d := &orderedDrain{e: f.e, size: cfg.Size, r: r, each: cfg.Mode == ModeOrderedEach, batches: cfg.Mode == ModeOrderedBatches, s: samplesFor(cfg.Mode)}
	d.fillRound = func(k int) (int, error) { return min(k, 1), f.fill(k) }
	d.checkFn = d.check
	return d, nil
}
