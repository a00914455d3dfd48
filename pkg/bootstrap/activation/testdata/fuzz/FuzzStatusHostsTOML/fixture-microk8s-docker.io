go test fuzz v1
[]byte("# source: https://github.com/canonical/microk8s path=microk8s-resources/default-args/certs.d/docker.io/hosts.toml commit=7b6cace0123641fbb4110ccc012f56fca86a5f9c (MicroK8s default hosts.toml for docker.io)\nserver = \"https://docker.io\"\n\n[host.\"https://registry-1.docker.io\"]\n  capabilities = [\"pull\", \"resolve\"]\n\n")
bool(true)
