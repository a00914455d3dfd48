package mirror

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/distribution/distribution/v3/configuration"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/s3-aws" // storage driver "s3aws"
)

// maxSizeS3 refuses --max-size with a shared bucket: replicas cannot agree on what to evict,
// and the bucket bounds itself.
const maxSizeS3 = "--max-size: not with --storage s3 (replicas share the bucket and cannot agree on what to evict); " +
	"bound the bucket with a lifecycle expiration rule on the blob data prefix instead (docs/large-clusters.md, Bounding the bucket)"

// Storage kinds (--storage).
const (
	// StorageFilesystem keeps blobs and manifests under Options.Root (the default).
	StorageFilesystem = "filesystem"
	// StorageS3 keeps them in an S3 bucket (Options.S3) through distribution's own s3-aws
	// driver; several replicas may share one bucket. Options.Root then holds only fills in
	// flight and the cache index.
	StorageS3 = "s3"
)

// S3Storage is where StorageS3 keeps the cache. Credentials come from the AWS SDK for Go v1's
// default chain (as distribution v3.1.2's driver uses it): AWS_ACCESS_KEY_ID and
// AWS_SECRET_ACCESS_KEY, the shared credentials file (profile from AWS_PROFILE, which serve's
// --s3-profile sets), web identity (IRSA: AWS_ROLE_ARN and AWS_WEB_IDENTITY_TOKEN_FILE), ECS and
// EC2 instance roles.
type S3Storage struct {
	// Bucket is the bucket name (required).
	Bucket string
	// Region is the bucket's AWS region, e.g. eu-west-1; required unless Endpoint is set
	// (then default us-east-1, for signing).
	Region string
	// Endpoint is an S3-compatible server's URL, http(s)://HOST[:PORT] (MinIO, Ceph RGW,
	// versitygw, ...). Empty: AWS.
	Endpoint string
	// PathStyle addresses the bucket as ENDPOINT/BUCKET instead of BUCKET.ENDPOINT.
	PathStyle bool
	// RootDirectory is a key prefix inside the bucket ("" : the bucket's root).
	RootDirectory string
}

// validate checks s for StorageS3; every problem, joined, named by flag.
func (s S3Storage) validate() error {
	var errs []error
	if s.Bucket == "" {
		errs = append(errs, errors.New("--s3-bucket: required with --storage s3"))
	}
	if s.Region == "" && s.Endpoint == "" {
		errs = append(errs, errors.New("--s3-region: required with --storage s3 unless --s3-endpoint names an S3-compatible server"))
	}
	if s.Endpoint != "" {
		u, err := url.Parse(s.Endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") {
			errs = append(errs, fmt.Errorf("--s3-endpoint %q: want http(s)://HOST[:PORT], e.g. https://minio.storage:9000", s.Endpoint))
		}
	}
	if strings.Contains(s.RootDirectory, "..") {
		errs = append(errs, fmt.Errorf("--s3-root-directory %q: want a key prefix without \"..\" in it", s.RootDirectory))
	}
	return errors.Join(errs...)
}

// storageConfig is distribution's storage configuration for opts: the filesystem driver under
// root, in memory when root is "", or the s3aws driver. Redirects are disabled for every
// driver: clients never see a 3xx, and nodes need no access to the bucket.
func storageConfig(opts Options) configuration.Storage {
	var cfg configuration.Storage
	switch {
	case opts.Storage == StorageS3:
		s := opts.S3
		p := configuration.Parameters{
			"bucket":         s.Bucket,
			"region":         s.Region,
			"forcepathstyle": s.PathStyle,
			"rootdirectory":  s.RootDirectory,
			"useragent":      opts.UserAgent,
		}
		if s.Endpoint != "" {
			p["regionendpoint"] = strings.TrimSuffix(s.Endpoint, "/")
			p["secure"] = strings.HasPrefix(s.Endpoint, "https://")
			if s.Region == "" {
				p["region"] = "us-east-1"
			}
		}
		cfg = configuration.Storage{"s3aws": p}
	case opts.Root == "":
		cfg = configuration.Storage{"inmemory": configuration.Parameters{}}
	default:
		cfg = configuration.Storage{"filesystem": configuration.Parameters{"rootdirectory": opts.Root}}
	}
	cfg["redirect"] = configuration.Parameters{"disable": true}
	return cfg
}
