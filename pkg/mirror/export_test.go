package mirror

// OnFillJoined makes every blob GET that joins a fill in flight call fn before it reads the
// fill: a test ends the fill there, or learns that the request joined it. Set it before the
// first request.
func (m *Mirror) OnFillJoined(fn func()) { m.fillJoined = fn }
