package registry

import (
	"crypto/x509"
	"fmt"
	"os"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
)

// Credentials name one private registry and the way into it: what an
// operator passes as --domain, --username, --ca-file and the TLS flags.
// Commands fill it from flags; Access turns it into an Access.
type Credentials struct {
	// Domain is the registry host[:port], optionally followed by a path
	// (only the host matters here).
	Domain string
	// Username and Password are sent to Domain, and only there. Without a
	// Username the docker config supplies credentials.
	Username, Password string
	// CAFile is a PEM bundle of CAs trusted, besides the system's, for
	// Domain's certificate.
	CAFile string
	// SkipTLSVerify accepts any certificate from Domain.
	SkipTLSVerify bool
	// PlainHTTP says Domain speaks HTTP, not HTTPS.
	PlainHTTP bool
}

// Access builds how to reach the registry: the CA pool, the hosts reached
// without TLS verification, and a keychain that answers with Username and
// Password for Domain and from the docker config for every other registry
// (so the password never travels to an upstream or mirror).
//
// Errors name the flag they come from (--ca-file), as the commands that
// fill Credentials show them as they are.
func (c Credentials) Access() (Access, error) {
	a := Access{}
	host, err := registryHost(c.Domain)
	if err != nil {
		return a, err
	}
	if c.PlainHTTP || c.SkipTLSVerify {
		a.Insecure = []string{host}
	}
	if c.CAFile != "" {
		pem, err := os.ReadFile(c.CAFile)
		if err != nil {
			return a, fmt.Errorf("--ca-file: %w", err)
		}
		pool, err := x509.SystemCertPool()
		if err != nil {
			pool = x509.NewCertPool()
		}
		if !pool.AppendCertsFromPEM(pem) {
			return a, fmt.Errorf("--ca-file %s: no PEM certificates in it", c.CAFile)
		}
		a.RootCAs = pool
	}
	if c.Username != "" {
		auth := authn.FromConfig(authn.AuthConfig{Username: c.Username, Password: c.Password})
		a.Keychain = authn.NewMultiKeychain(hostKeychain{host: host, auth: auth}, authn.DefaultKeychain)
	}
	return a, nil
}

// registryHost is the registry part of a domain, spelt as references on it
// spell their registry (so "docker.io" is "index.docker.io"): the keychain
// and the insecure list compare hosts as strings.
func registryHost(domain string) (string, error) {
	host, _, _ := strings.Cut(strings.TrimSuffix(domain, "/"), "/")
	reg, err := name.NewRegistry(host)
	if err != nil || host == "" {
		return "", fmt.Errorf("registry domain %q: not a host[:port]", domain)
	}
	return reg.RegistryStr(), nil
}

// hostKeychain answers with auth for one registry host, and anonymously
// (so a multi-keychain asks the next one) for every other.
type hostKeychain struct {
	host string
	auth authn.Authenticator
}

func (k hostKeychain) Resolve(r authn.Resource) (authn.Authenticator, error) {
	if r.RegistryStr() == k.host {
		return k.auth, nil
	}
	return authn.Anonymous, nil
}
