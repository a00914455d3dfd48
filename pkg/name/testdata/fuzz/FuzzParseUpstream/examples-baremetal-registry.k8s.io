go test fuzz v1
string("registry.k8s.io=https://registry.k8s.io")
