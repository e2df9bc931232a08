// Command training-operator-lab runs Kubeflow's training operator (v1.9.x, the upstream controller
// and webhook packages, unchanged) outside a Pod, on loopback, for the test lab.
//
// Why not upstream's cmd/training-operator.v1: its webhook server has no host option, so it binds
// every interface; and its cert management (pkg/cert.ManageCerts) writes the serving cert only into
// a Secret and then waits for a kubelet to mount that Secret at a fixed directory. No controller
// starts until it appears. This main differs only there:
//   - --webhook-host (default 127.0.0.1) and --webhook-cert-dir;
//   - the same cert rotator, with "localhost" added to the serving cert (a
//     ValidatingWebhookConfiguration can then use url: https://localhost:PORT/...);
//   - a loop that copies the Secret's files into the cert dir, which is what the kubelet's Secret
//     volume does for the upstream Deployment;
//   - metrics and probes on 127.0.0.1 by default; no gang-scheduler integration (not used here).
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/open-policy-agent/cert-controller/pkg/rotator"
	"go.uber.org/zap/zapcore"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/util/flowcontrol"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	kubeflowv1 "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"
	"github.com/kubeflow/training-operator/pkg/config"
	controllerv1 "github.com/kubeflow/training-operator/pkg/controller.v1"
	"github.com/kubeflow/training-operator/pkg/controller.v1/common"
	"github.com/kubeflow/training-operator/pkg/webhooks"
)

// The names upstream uses (cmd/training-operator.v1/main.go, pkg/cert/cert.go): the upstream
// manifests refer to them.
const (
	webhookConfigurationName = "validator.training-operator.kubeflow.org"
	caName                   = "training-operator-ca"
	caOrganization           = "training-operator"
	defaultNamespace         = "kubeflow"
)

var (
	scheme   = runtime.NewScheme()
	setupLog = ctrl.Log.WithName("setup")
)

func init() {
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(kubeflowv1.AddToScheme(scheme))
}

func operatorNamespace() string {
	if ns := os.Getenv("MY_POD_NAMESPACE"); ns != "" {
		return ns
	}
	return defaultNamespace
}

func fail(err error, msg string, kv ...any) {
	setupLog.Error(err, msg, kv...)
	os.Exit(1)
}

func main() {
	var (
		metricsAddr, probeAddr, namespace                      string
		webhookHost, webhookCertDir                            string
		webhookServiceName, webhookSecretName                  string
		enabledSchemes                                         controllerv1.EnabledSchemes
		controllerThreads, webhookPort, clientQPS, clientBurst int
	)
	flag.StringVar(&metricsAddr, "metrics-bind-address", "127.0.0.1:8080", "The address the metrics endpoint binds to.")
	flag.StringVar(&probeAddr, "health-probe-bind-address", "127.0.0.1:8081", "The address the probe endpoint binds to.")
	flag.Var(&enabledSchemes, "enable-scheme", "Enable scheme(s), e.g. --enable-scheme=pytorchjob (default: all).")
	flag.StringVar(&namespace, "namespace", os.Getenv("KUBEFLOW_NAMESPACE"), "Watch only this namespace (default: all).")
	flag.IntVar(&controllerThreads, "controller-threads", 1, "Worker threads per controller.")
	flag.IntVar(&clientQPS, "kube-api-qps", 20, "Client QPS towards the API server.")
	flag.IntVar(&clientBurst, "kube-api-burst", 30, "Client burst towards the API server.")
	flag.StringVar(&config.Config.PyTorchInitContainerImage, "pytorch-init-container-image",
		config.PyTorchInitContainerImageDefault, "The image of the PyTorch init container.")
	flag.StringVar(&config.Config.PyTorchInitContainerTemplateFile, "pytorch-init-container-template-file",
		config.PyTorchInitContainerTemplateFileDefault, "The template of the PyTorch init container.")
	flag.IntVar(&config.Config.PyTorchInitContainerMaxTries, "pytorch-init-container-max-tries",
		config.PyTorchInitContainerMaxTriesDefault, "Tries of the PyTorch init container.")
	flag.StringVar(&config.Config.MPIKubectlDeliveryImage, "mpi-kubectl-delivery-image",
		config.MPIKubectlDeliveryImageDefault, "The image of the MPI launcher init container.")
	flag.IntVar(&webhookPort, "webhook-server-port", 9443, "Port of the webhook server.")
	flag.StringVar(&webhookHost, "webhook-host", "127.0.0.1", "Address the webhook server binds to.")
	flag.StringVar(&webhookCertDir, "webhook-cert-dir", "", "Directory of the webhook serving cert (required).")
	flag.StringVar(&webhookServiceName, "webhook-service-name", "training-operator", "Service name in the serving cert.")
	flag.StringVar(&webhookSecretName, "webhook-secret-name", "training-operator-webhook-cert", "Secret holding the CA and serving cert.")
	opts := zap.Options{Development: true, StacktraceLevel: zapcore.DPanicLevel}
	opts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts)))
	if webhookCertDir == "" {
		fail(errors.New("--webhook-cert-dir is required"), "flags")
	}

	var cacheOpts cache.Options
	if namespace != "" {
		cacheOpts = cache.Options{DefaultNamespaces: map[string]cache.Config{namespace: {}}}
	}
	cfg := ctrl.GetConfigOrDie()
	cfg.RateLimiter = flowcontrol.NewTokenBucketRateLimiter(float32(clientQPS), clientBurst)
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: metricsAddr},
		WebhookServer:          webhook.NewServer(webhook.Options{Host: webhookHost, Port: webhookPort, CertDir: webhookCertDir}),
		HealthProbeBindAddress: probeAddr,
		Cache:                  cacheOpts,
	})
	if err != nil {
		fail(err, "unable to create the manager")
	}

	ns := operatorNamespace()
	secret := types.NamespacedName{Namespace: ns, Name: webhookSecretName}
	certsReady := make(chan struct{})
	if err := rotator.AddRotator(mgr, &rotator.CertRotator{
		SecretKey:             secret,
		CertDir:               webhookCertDir,
		CAName:                caName,
		CAOrganization:        caOrganization,
		DNSName:               fmt.Sprintf("%s.%s.svc", webhookServiceName, ns),
		ExtraDNSNames:         []string{"localhost"},
		IsReady:               certsReady,
		Webhooks:              []rotator.WebhookInfo{{Type: rotator.Validating, Name: webhookConfigurationName}},
		RequireLeaderElection: false,
	}); err != nil {
		fail(err, "unable to set up cert rotation")
	}
	go mountSecret(mgr.GetAPIReader(), secret, webhookCertDir)

	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		fail(err, "unable to set up the health check")
	}
	if err := mgr.AddReadyzCheck("readyz", func(req *http.Request) error {
		select {
		case <-certsReady:
			return mgr.GetWebhookServer().StartedChecker()(req)
		default:
			return errors.New("certificates are not ready")
		}
	}); err != nil {
		fail(err, "unable to set up the ready check")
	}
	go setupControllers(mgr, enabledSchemes, controllerThreads, certsReady)

	setupLog.Info("starting manager")
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		fail(err, "problem running the manager")
	}
}

// mountSecret keeps the cert dir equal to the Secret's data, as the kubelet's Secret volume does
// for the upstream Deployment; the rotator waits for these files, then controller-runtime's cert
// watcher reloads them on rotation.
func mountSecret(r client.Reader, key types.NamespacedName, dir string) {
	log := ctrl.Log.WithName("secret-volume")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		fail(err, "cannot create the cert dir", "dir", dir)
	}
	for {
		s := &corev1.Secret{}
		if err := r.Get(context.Background(), key, s); err == nil {
			for _, name := range []string{"ca.crt", "tls.crt", "tls.key"} {
				data := s.Data[name]
				path := filepath.Join(dir, name)
				if len(data) == 0 {
					continue
				}
				if old, _ := os.ReadFile(path); bytes.Equal(old, data) {
					continue
				}
				if err := os.WriteFile(path+".tmp", data, 0o600); err == nil && os.Rename(path+".tmp", path) == nil {
					log.Info("wrote", "file", path)
				}
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func setupControllers(mgr ctrl.Manager, schemes controllerv1.EnabledSchemes, threads int, certsReady <-chan struct{}) {
	<-certsReady
	setupLog.Info("certs ready, registering controllers")
	if schemes.Empty() {
		schemes.FillAll()
	}
	for _, s := range schemes {
		setupReconciler, ok := controllerv1.SupportedSchemeReconciler[s]
		if !ok {
			fail(errors.New("scheme is not supported"), "controllers", "scheme", s)
		}
		if err := setupReconciler(mgr, common.GenNonGangSchedulerSetupFunc(), threads); err != nil {
			fail(err, "unable to create the controller", "scheme", s)
		}
		setupWebhook, ok := webhooks.SupportedSchemeWebhook[s]
		if !ok {
			fail(errors.New("scheme has no webhook"), "webhooks", "scheme", s)
		}
		if err := setupWebhook(mgr); err != nil {
			fail(err, "unable to set up the webhook", "scheme", s)
		}
	}
}
