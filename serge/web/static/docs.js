// Starts Swagger UI on /docs from Serge's own copy (static/swagger/), so the API reference works
// offline; kept out of the page because the page's policy allows no inline script.
window.ui = SwaggerUIBundle({
  url: "/openapi.json",
  dom_id: "#swagger-ui",
  layout: "BaseLayout",
  deepLinking: true,
  showExtensions: true,
  showCommonExtensions: true,
  validatorUrl: null, // never send the API description to a validator on the internet
  presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset],
});
