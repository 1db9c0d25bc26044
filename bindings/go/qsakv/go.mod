module qsakv.dev/qsakv

go 1.19
