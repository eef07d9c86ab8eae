// SPDX-License-Identifier: Apache-2.0

package perfbuf

// Typed views of records: a payload as a *T, checked, in place where it can
// be.

import (
	"fmt"
	"os"
	"reflect"
	"unsafe"

	"github.com/perfbuf/perfbuf/internal/ring"
)

// View reads payloads as values of T, a fixed-size type without pointers
// (bpf2go's generated types are such), without allocating: in place when
// the payload holds a whole T at an address aligned for T, else copied
// into memory the caller gives. A perf ring's payload is 4 bytes past an
// 8-byte boundary, so a T with 8-byte fields is copied there.
type View[T any] struct {
	// last is T's size less one, and keep the bits of an address aligned
	// for T: a zero View (last 0, keep 0) takes no payload in place.
	last int
	keep uintptr
	size int
}

// NewView checks T once: a size above zero, and no pointer, slice, map,
// string, interface, channel or function in it (os.ErrInvalid, naming the
// field).
func NewView[T any]() (View[T], error) {
	typ := reflect.TypeFor[T]()
	if typ.Size() == 0 {
		return View[T]{}, fmt.Errorf("view of %v: a type of size 0: %w", typ, os.ErrInvalid)
	}
	if path, bad := pointerIn(typ, typ.String()); bad != nil {
		return View[T]{}, fmt.Errorf("view of %v: %s is a %v, which ring memory cannot hold (a fixed-size type without pointers): %w",
			typ, path, bad, os.ErrInvalid)
	}
	size, align := int(typ.Size()), uintptr(typ.Align())
	return View[T]{last: size - 1, keep: ^(align - 1), size: size}, nil
}

// pointerIn returns the first part of typ, named from path, whose kind
// holds a pointer, or nil.
func pointerIn(typ reflect.Type, path string) (string, reflect.Type) {
	switch typ.Kind() {
	case reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr,
		reflect.Float32, reflect.Float64, reflect.Complex64, reflect.Complex128:
		return "", nil
	case reflect.Array:
		return pointerIn(typ.Elem(), path+"[0]")
	case reflect.Struct:
		for i := range typ.NumField() {
			f := typ.Field(i)
			if p, bad := pointerIn(f.Type, path+"."+f.Name); bad != nil {
				return p, bad
			}
		}
		return "", nil
	}
	return path, typ
}

// Record returns rec's payload as a *T, in place (valid as rec.Data is) or
// copied into buf. A payload shorter than T, or a lost record, is an error
// that names both sizes (os.ErrInvalid).
func (v View[T]) Record(rec *Record, buf *T) (*T, error) {
	// The payload's bytes are the kernel's, published before the reader
	// parsed the record (its header's acquire load: internal/ring); a *T
	// over them reads what rec.Data reads.
	p := unsafe.Pointer(unsafe.SliceData(rec.Data))
	if len(rec.Data) > v.last && uintptr(p)&^v.keep == 0 {
		return (*T)(p), nil
	}
	if v.size == 0 {
		return nil, v.zero()
	}
	if n := len(rec.Data) + len(rec.Wrapped); n < v.size || rec.Type != RecordSample {
		return nil, v.short(rec.Type, n)
	}
	dst := unsafe.Slice((*byte)(unsafe.Pointer(buf)), v.size)
	if len(rec.Data) >= v.size {
		ring.CopyData(dst, rec.Data[:v.size]) // (16 to 64 bytes in line, as the copying reads do)
	} else {
		copy(dst[copy(dst, rec.Data):], rec.Wrapped) // the rest after a perf ring's end
	}
	return buf, nil
}

// Sample is Record for a copy: in place in s.Data, or copied into buf.
func (v View[T]) Sample(s *Sample, buf *T) (*T, error) {
	p := unsafe.Pointer(unsafe.SliceData(s.Data))
	if len(s.Data) > v.last && s.Type == RecordSample && uintptr(p)&^v.keep == 0 {
		return (*T)(p), nil
	}
	if v.size == 0 {
		return nil, v.zero()
	}
	if len(s.Data) < v.size || s.Type != RecordSample {
		return nil, v.short(s.Type, len(s.Data))
	}
	ring.CopyData(unsafe.Slice((*byte)(unsafe.Pointer(buf)), v.size), s.Data[:v.size])
	return buf, nil
}

// short is the error for a payload of n bytes, or a record with none.
func (v View[T]) short(typ RecordType, n int) error {
	if typ != RecordSample {
		return fmt.Errorf("view of %v: a lost record has no payload: %w", reflect.TypeFor[T](), os.ErrInvalid)
	}
	return fmt.Errorf("view of %v: a %d-byte payload is shorter than its %d bytes: %w", reflect.TypeFor[T](), n, v.size, os.ErrInvalid)
}

// zero is the error of a View not made by NewView.
func (v View[T]) zero() error {
	return fmt.Errorf("view of %v: not made by NewView: %w", reflect.TypeFor[T](), os.ErrInvalid)
}
