//go:build !linux

package bootstrap

import (
	"errors"
	"time"
)

// ClockBootTime needs Linux's CLOCK_BOOTTIME; other systems (the darwin release, for gen talos
// and warm) have no node /proc to compare it with.
func ClockBootTime() (time.Time, error) {
	return time.Time{}, errors.New("read CLOCK_BOOTTIME: Linux only")
}
