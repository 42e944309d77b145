module github.com/tollgate/tollgate/clients/go

go 1.19
