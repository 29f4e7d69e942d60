package nodeaccess

import "strings"

// Quote quotes s as one word for a POSIX shell: as it is when no shell
// treats any of its characters specially, else in single quotes, closing
// and reopening them around each quote it holds:
//
//	it's  ->  'it'\''s'
func Quote(s string) string {
	if s != "" && strings.Trim(s, safeChars) == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

const safeChars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789@%+=:,./_-"
