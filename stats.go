package perfbuf

// What Stats adds to the counts the read side publishes: each ring's fill
// at the time of the call.

// completeStats fills in st (one entry per ring of raw, a copy the caller
// owns) with what is read at the time of the call: each ring's fill, while
// life says the rings are mapped. It may run on any goroutine: Used loads
// data_head and data_tail atomically.
func completeStats(st []Stats, raw []*RawBuffer, life *lifetime) []Stats {
	if life.enter("") == nil {
		for i := range st {
			st[i].Fill = raw[i].Used()
		}
		life.exit()
	}
	return st
}
