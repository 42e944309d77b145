package tollgate

// BLAKE2b (RFC 7693), keyed, with the parameter block's personalization.
// Our own because Go's standard library has no BLAKE2b at all (it lives in
// golang.org/x/crypto, and this module has no dependencies), and the
// password digest and tag need keyed BLAKE2b-128 with a personalization.

import (
	"encoding/binary"
	"math/bits"
)

const (
	blake2bBlockBytes = 128
	blake2bKeyMax     = 64
	blake2bOutMax     = 64
)

var blake2bIV = [8]uint64{
	0x6a09e667f3bcc908, 0xbb67ae8584caa73b, 0x3c6ef372fe94f82b, 0xa54ff53a5f1d36f1,
	0x510e527fade682d1, 0x9b05688c2b3e6c1f, 0x1f83d9abfb41bd6b, 0x5be0cd19137e2179,
}

var blake2bSigma = [12][16]byte{
	{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
	{14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
	{11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4},
	{7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8},
	{9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13},
	{2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9},
	{12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11},
	{13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10},
	{6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5},
	{10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0},
	{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
	{14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
}

// blake2b is one hash in progress. The last block is held back until Sum,
// because the final compression must be flagged and data may still come.
type blake2b struct {
	h       [8]uint64
	t       [2]uint64
	buf     [blake2bBlockBytes]byte
	buffed  int
	outSize int
}

// newBlake2b starts a hash of outSize bytes (1..64) under key (0..64
// bytes) with an empty salt and the given personalization (at most 16
// bytes, zero-padded).
func newBlake2b(outSize int, key, personal []byte) *blake2b {
	if outSize < 1 || outSize > blake2bOutMax || len(key) > blake2bKeyMax || len(personal) > 16 {
		panic("blake2b: parameter out of range")
	}
	var param [64]byte
	param[0] = byte(outSize)
	param[1] = byte(len(key))
	param[2] = 1 // fanout
	param[3] = 1 // depth
	copy(param[48:64], personal)
	d := &blake2b{outSize: outSize}
	for i := range d.h {
		d.h[i] = blake2bIV[i] ^ binary.LittleEndian.Uint64(param[i*8:])
	}
	if len(key) > 0 {
		copy(d.buf[:], key)
		d.buffed = blake2bBlockBytes
	}
	return d
}

func (d *blake2b) Write(p []byte) {
	for len(p) > 0 {
		if d.buffed == blake2bBlockBytes {
			d.addCount(blake2bBlockBytes)
			d.compress(false)
			d.buffed = 0
		}
		n := copy(d.buf[d.buffed:], p)
		d.buffed += n
		p = p[n:]
	}
}

func (d *blake2b) addCount(n uint64) {
	var carry uint64
	d.t[0], carry = bits.Add64(d.t[0], n, 0)
	d.t[1] += carry
}

func (d *blake2b) Sum() []byte {
	d.addCount(uint64(d.buffed))
	for i := d.buffed; i < blake2bBlockBytes; i++ {
		d.buf[i] = 0
	}
	d.compress(true)
	var out [64]byte
	for i, v := range d.h {
		binary.LittleEndian.PutUint64(out[i*8:], v)
	}
	return out[:d.outSize]
}

func (d *blake2b) compress(last bool) {
	var m [16]uint64
	for i := range m {
		m[i] = binary.LittleEndian.Uint64(d.buf[i*8:])
	}
	var v [16]uint64
	copy(v[:8], d.h[:])
	copy(v[8:], blake2bIV[:])
	v[12] ^= d.t[0]
	v[13] ^= d.t[1]
	if last {
		v[14] = ^v[14]
	}
	g := func(a, b, c, e int, x, y uint64) {
		v[a] = v[a] + v[b] + x
		v[e] = bits.RotateLeft64(v[e]^v[a], -32)
		v[c] = v[c] + v[e]
		v[b] = bits.RotateLeft64(v[b]^v[c], -24)
		v[a] = v[a] + v[b] + y
		v[e] = bits.RotateLeft64(v[e]^v[a], -16)
		v[c] = v[c] + v[e]
		v[b] = bits.RotateLeft64(v[b]^v[c], -63)
	}
	for _, s := range blake2bSigma {
		g(0, 4, 8, 12, m[s[0]], m[s[1]])
		g(1, 5, 9, 13, m[s[2]], m[s[3]])
		g(2, 6, 10, 14, m[s[4]], m[s[5]])
		g(3, 7, 11, 15, m[s[6]], m[s[7]])
		g(0, 5, 10, 15, m[s[8]], m[s[9]])
		g(1, 6, 11, 12, m[s[10]], m[s[11]])
		g(2, 7, 8, 13, m[s[12]], m[s[13]])
		g(3, 4, 9, 14, m[s[14]], m[s[15]])
	}
	for i := range d.h {
		d.h[i] ^= v[i] ^ v[i+8]
	}
}
