package bundle

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"os"

	"github.com/kubelift/kubelift/internal/atomicfile"
)

// Bundles are signed with ECDSA P-256 over SHA-256, signatures in ASN.1 DER,
// keys in PEM (PKCS#8 private, PKIX public): the same as
// `openssl dgst -sha256 -sign key.pem` produces and
// `openssl dgst -sha256 -verify pub.pem -signature bundle.json.sig bundle.json`
// checks.

// GenerateKey writes prefix.key (mode 0600) and prefix.pub. It never
// overwrites an existing file. It returns the key's fingerprint.
func GenerateKey(prefix string) (string, error) {
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", err
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return "", err
	}
	pubDER, err := x509.MarshalPKIXPublicKey(&priv.PublicKey)
	if err != nil {
		return "", err
	}
	for _, p := range []string{prefix + ".key", prefix + ".pub"} {
		if _, err := os.Lstat(p); err == nil {
			return "", fmt.Errorf("%s already exists: refusing to overwrite a key", p)
		}
	}
	if err := atomicfile.WriteFile(prefix+".key", pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600, atomicfile.NoReplace()); err != nil {
		return "", fmt.Errorf("write private key: %w", err)
	}
	if err := atomicfile.WriteFile(prefix+".pub", pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}), 0o644, atomicfile.NoReplace()); err != nil {
		os.Remove(prefix + ".key")
		return "", fmt.Errorf("write public key: %w", err)
	}
	return fingerprintDER(pubDER), nil
}

// LoadPrivateKey reads a PKCS#8 (or SEC1 "EC PRIVATE KEY") P-256 key.
func LoadPrivateKey(path string) (*ecdsa.PrivateKey, error) {
	block, err := readPEM(path)
	if err != nil {
		return nil, err
	}
	var key any
	switch block.Type {
	case "PRIVATE KEY":
		key, err = x509.ParsePKCS8PrivateKey(block.Bytes)
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(block.Bytes)
	default:
		return nil, fmt.Errorf("%s: PEM block %q is not a private key", path, block.Type)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	ec, ok := key.(*ecdsa.PrivateKey)
	if !ok || ec.Curve != elliptic.P256() {
		return nil, fmt.Errorf("%s: want an ECDSA P-256 key (bundle keygen makes one)", path)
	}
	return ec, nil
}

// LoadPublicKey reads a PKIX "PUBLIC KEY" P-256 key.
func LoadPublicKey(path string) (*ecdsa.PublicKey, error) {
	block, err := readPEM(path)
	if err != nil {
		return nil, err
	}
	if block.Type != "PUBLIC KEY" {
		return nil, fmt.Errorf("%s: PEM block %q is not a public key (pass the .pub file)", path, block.Type)
	}
	key, err := x509.ParsePKIXPublicKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	ec, ok := key.(*ecdsa.PublicKey)
	if !ok || ec.Curve != elliptic.P256() {
		return nil, fmt.Errorf("%s: want an ECDSA P-256 public key", path)
	}
	return ec, nil
}

func readPEM(path string) (*pem.Block, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	block, _ := pem.Decode(data)
	if block == nil {
		return nil, fmt.Errorf("%s: no PEM data", path)
	}
	return block, nil
}

// Fingerprint returns "sha256:<hex>" of the key's PKIX DER encoding, the
// same as `openssl pkey -pubin -in pub.pem -outform DER | sha256sum`.
func Fingerprint(pub *ecdsa.PublicKey) string {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return "invalid-key"
	}
	return fingerprintDER(der)
}

func fingerprintDER(der []byte) string {
	sum := sha256.Sum256(der)
	return "sha256:" + hex.EncodeToString(sum[:])
}

func sign(priv *ecdsa.PrivateKey, data []byte) ([]byte, error) {
	sum := sha256.Sum256(data)
	return priv.Sign(rand.Reader, sum[:], crypto.SHA256)
}

func verifySignature(pub *ecdsa.PublicKey, data, sig []byte) error {
	sum := sha256.Sum256(data)
	if !ecdsa.VerifyASN1(pub, sum[:], sig) {
		return errors.New("signature does not verify")
	}
	return nil
}
