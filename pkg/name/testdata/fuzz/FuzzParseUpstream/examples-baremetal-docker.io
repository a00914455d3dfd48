go test fuzz v1
string("docker.io=https://registry-1.docker.io")
