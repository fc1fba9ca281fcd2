package sdk_test

import (
	"testing"

	"lock.dev/lockd/internal/lockdtest"
)

func TestMain(m *testing.M) { lockdtest.Main(m) }
