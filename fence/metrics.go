package fence

import "github.com/prometheus/client_golang/prometheus"

// Resources: the resource label of lockd_fence_stale_refused_total (C4
// #ct4-fence).
const (
	ResourceHTTP     = "http"
	ResourcePostgres = "postgres"
	ResourceFile     = "file"
)

// Metrics counts the writes the fence refused (C4 #ct4-fence). A nil
// *Metrics counts nothing.
type Metrics struct {
	refused *prometheus.CounterVec
}

// NewMetrics registers lockd_fence_stale_refused_total on reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{refused: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lockd_fence_stale_refused_total",
		Help: "Writes the fence refused because their token was below the key's high-water mark.",
	}, []string{"resource"})}
	for _, r := range []string{ResourceHTTP, ResourcePostgres, ResourceFile} {
		m.refused.WithLabelValues(r)
	}
	if err := reg.Register(m.refused); err != nil {
		return nil, err
	}
	return m, nil
}

// Refused counts one refused write of resource (one of the Resource
// constants).
func (m *Metrics) Refused(resource string) {
	if m != nil {
		m.refused.WithLabelValues(resource).Inc()
	}
}
