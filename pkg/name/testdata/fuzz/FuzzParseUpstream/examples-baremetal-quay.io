go test fuzz v1
string("quay.io=https://quay.io")
