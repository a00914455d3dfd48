go test fuzz v1
string("registry.k8s.io")
