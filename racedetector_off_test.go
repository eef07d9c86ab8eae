// SPDX-License-Identifier: Apache-2.0

//go:build !race

package perfbuf

// raceDetector: built without -race.
const raceDetector = false
