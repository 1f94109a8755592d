package console

// Notice is what every page of s says of the console's database login (see loginNotice):
// "" when the login can do an operator's work. `extworker doctor` reports it.
func (s *Server) Notice() string {
	if h, ok := s.handler.(*handler); ok {
		return h.opts.Notice
	}
	return ""
}
