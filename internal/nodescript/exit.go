package nodescript

// The exit codes the node scripts use to say what went wrong, with
// sysexits.h's meanings, so that the engine tells a wrong file from a
// cut-off transfer or a registry the node cannot reach. Every other
// non-zero exit is a failure with nothing more to say.
const (
	// ExitUsage (EX_USAGE): an argument the script does not know (a
	// codec).
	ExitUsage = 64
	// ExitDataErr (EX_DATAERR): a file whole but wrong (its size or
	// sha256), removed; or one a blob's announced length shows to be
	// longer than recorded.
	ExitDataErr = 65
	// ExitNoInput (EX_NOINPUT): what must be there is not: the registry
	// refused the file (an HTTP error), or the binary to back up is not
	// the old version.
	ExitNoInput = 66
	// ExitUnavailable (EX_UNAVAILABLE): the registry cannot be reached, or
	// is not trusted, from the node.
	ExitUnavailable = 69
	// ExitTempFail (EX_TEMPFAIL): cut off; what arrived stays and the next
	// run goes on from there.
	ExitTempFail = 75
)
